"""The lab's tokenizer (data/lab/, data/lab.py): the committed files are what the code
writes, every lab task's text round-trips through it, transformers reads the folder to
the same ids, and a lab model is a preset's random weights with it, loaded like any other."""

import filecmp
import json
import os

from explore_rl.data import countdown, lab, multistep, tasks
from explore_rl.models import weights
from explore_rl.models.tokenizer import Tokenizer

FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def test_the_committed_folder_is_what_the_code_writes(tmp_path):
    lab.write_tokenizer(str(tmp_path))
    for name in FILES:
        assert filecmp.cmp(tmp_path / name, os.path.join(lab.FOLDER, name), shallow=False), name


def test_every_lab_text_round_trips_one_token_a_character():
    tok = Tokenizer.from_hf_folder(lab.FOLDER)
    assert tok.vocab_size == 2 + len(lab.ALPHABET) and tok.stop_ids == (tok.eos_id,)
    problems = countdown.make_countdown(50, 0, "train") + multistep.make_multistep(50, 0, "train")
    for p in problems:
        for text in (p.question + "\n", p.solution):
            ids = tok.encode(text)
            assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.decode(tok.encode("3+4=7") + [tok.eos_id]) == "3+4=7"  # EOS is not text


def test_transformers_reads_the_folder_to_the_same_ids():
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(lab.FOLDER)
    ours = Tokenizer.from_hf_folder(lab.FOLDER)
    text = "12 34 5 8 -> 57\n34-12=22\n(3+5)*(7-2)"
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert theirs.eos_token == "<eos>" and theirs.pad_token == "<pad>"


def test_a_lab_model_is_a_presets_random_weights_with_the_lab_tokenizer():
    params, cfg, tok = weights.load(lab.FOLDER, "lab-1m", seed=0)
    assert cfg.vocab_size == tok.vocab_size == 2 + len(lab.ALPHABET)
    assert params["embed"].shape == (cfg.vocab_size, 128)
    assert 0.5e6 < cfg.num_params() < 1.5e6  # a CPU's size


def test_the_committed_splits_are_what_the_code_draws_and_every_run_reads_them():
    """data/countdown/ is `write_splits`' output (the test split whole, the training one's
    first rows: the draw is sequential, so a prefix is the same draw), disjoint, every
    solution correct, and a run reads the same problems whatever its seed."""
    from configs import lab as lab_config
    from explore_rl import config as config_lib
    from explore_rl.data import jsonl

    def rows(split, n=None):
        with open(os.path.join(lab.SPLITS_FOLDER, f"{split}.jsonl")) as f:
            return [json.loads(line) for line in f][:n]

    def as_rows(ps):
        return [{"question": p.question, "answer": p.answer, "solution": p.solution} for p in ps]

    test, train = rows("test"), rows("train")
    assert len(test) == lab.SPLIT_SIZES["test"] and len(train) == lab.SPLIT_SIZES["train"]
    assert test == as_rows(countdown.make_countdown(len(test), 0, "test"))
    assert train[:1000] == as_rows(countdown.make_countdown(1000, 0, "train"))
    assert {r["question"] for r in train}.isdisjoint(r["question"] for r in test)
    for r in test + train[:2000]:
        problem = tasks.Problem(r["question"], r["answer"])
        assert not r["solution"] or countdown.reward(r["solution"], problem) == 1.0
    seeds = [config_lib.spec(lab_config.get_config("sft,smoke")).problems()]
    other = lab_config.get_config("sft,smoke")
    other.seed = 7
    seeds.append(config_lib.spec(other).problems())
    assert seeds[0] == seeds[1] and jsonl.files(config_lib.spec(other).task)[1] == [
        os.path.join(lab.SPLITS_FOLDER, "test.jsonl")
    ]

"""The lab's tokenizer (data/lab/, data/lab.py): the committed files are what the code
writes, every lab task's text round-trips through it, transformers reads the folder to
the same ids, and a lab model is a preset's random weights with it, loaded like any other.
Lab v2's (data/lab2/) too, its neutral tokens ids the task never writes."""

import dataclasses
import filecmp
import json
import os

import pytest

from explore_rl.data import countdown, lab, multistep, tasks
from explore_rl.models import weights
from explore_rl.models.tokenizer import Tokenizer

FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def test_the_committed_folder_is_what_the_code_writes(tmp_path):
    lab.write_tokenizer(str(tmp_path))
    for name in FILES:
        assert filecmp.cmp(tmp_path / name, os.path.join(lab.FOLDER, name), shallow=False), name


def test_the_committed_lab2_folder_is_what_the_code_writes(tmp_path):
    lab.write_tokenizer(str(tmp_path), lab.ALPHABET + lab.NEUTRAL)
    for name in FILES:
        assert filecmp.cmp(tmp_path / name, os.path.join(lab.V2_FOLDER, name), shallow=False)


@pytest.mark.parametrize("v2", [False, True])
def test_every_lab_text_round_trips_one_token_a_character(v2):
    tok = Tokenizer.from_hf_folder(lab.V2_FOLDER if v2 else lab.FOLDER)
    alphabet = lab.ALPHABET + lab.NEUTRAL * v2
    assert tok.vocab_size == 2 + len(alphabet) and tok.stop_ids == (tok.eos_id,)
    problems = countdown.make_countdown(50, 0, "train") + multistep.make_multistep(50, 0, "train")
    spec = countdown.Spec(inputs=4, other_share=0.10)
    problems += countdown.make_countdown(50, 0, "train", spec)  # lab v2's, other solutions too
    for p in problems:
        for text in (p.question + "\n", p.solution):
            ids = tok.encode(text)
            assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.decode(tok.encode("3+4=7") + [tok.eos_id]) == "3+4=7"  # EOS is not text
    if v2:  # the neutral tokens: the last ids of the lab model's 32, none a task character
        neutral = tok.token_ids(",".join(lab.NEUTRAL), "test")
        assert neutral == list(range(22, 32)) and tok.vocab_size == 32
        assert set(neutral).isdisjoint(tok.encode(lab.ALPHABET))


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


def test_lab_v2_gives_extra_recurring_problems_and_the_papers_settings():
    """configs/<method>.py:lab2 (docs/lab.md, "Lab v2"): RL draws 300 steps x 16 prompts
    from 640 problems, each 7 or 8 times and every one by step 40; 4-number problems (3
    lines); ExTra at the paper's hard rule and guided share (1 group of 16); the base model's
    recipe SFT on all 20,000 with a tenth of its solutions by other strategies and a tenth
    of its examples carrying a neutral token, in lab v2's vocabulary; study 1's lab scale
    as it was."""
    import collections

    from explore_rl import config as config_lib
    from explore_rl.train import base_model, steps

    c = config_lib.load("configs/extra.py:lab2")
    r, e = c.rollout, c.exploration.extra
    drawn = steps.stream(list(range(c.task.train_size)), c.seed, 0, 300 * r.prompts, r.pool)
    assert (c.train.steps, r.prompts, r.pool, len(drawn)) == (300, 16, 640, 4800)
    assert set(collections.Counter(drawn).values()) == {7, 8}
    assert max(drawn[: 40 * r.prompts]) == 639 and len(set(drawn[: 40 * r.prompts])) == 640
    assert (e.hard, int(e.guided_frac * r.prompts)) == ("all_incorrect", 1)
    assert (e.min_gap, e.warmup) == (4, 30)
    assert (c.task.name, c.task.countdown.inputs, c.exploration.scale) == ("countdown", 4, "lab2")
    sft = base_model.recipe(c)
    assert sft.model.base == "" and sft.rollout.pool == 0 and sft.task.train_size == 20000
    assert (sft.task.countdown.other_share, sft.train.steps) == (0.10, 2000)
    assert (sft.sft.neutral_share, sft.sft.neutral_tokens) == (0.10, "a,b,c,d,e,f,g,h,i,j")
    assert sft.model.path == lab.V2_FOLDER != lab.FOLDER
    for method in ("grpo", "ead", "eden", "ase"):
        assert base_model.recipe(config_lib.load(f"configs/{method}.py:lab2")).to_dict() == (
            sft.to_dict()
        )  # every arm starts from one base model
    v1 = config_lib.load("configs/extra.py:lab")
    assert (v1.exploration.extra.hard, v1.exploration.extra.guided_frac) == ("pass_rate", 0.5)
    assert (v1.rollout.pool, v1.task.name, v1.task.countdown.other_share) == (0, "jsonl", 0.0)
    assert v1.model.path == lab.FOLDER and base_model.recipe(v1).sft.neutral_share == 0.0


def test_edens_lab2_screen_draws_its_candidates_from_the_neutral_tokens():
    """configs/eden.py:lab2 resolves, its screen's pool the 10 neutral tokens (all of them
    candidates, 8 the bank); at lab its 20 ordinary characters, as study 1 ran."""
    from explore_rl import config as config_lib
    from explore_rl.exploration import eden

    spec = config_lib.resolve(config_lib.load("configs/eden.py:lab2"))
    ((_, settings),) = spec.methods
    assert (settings.pool_tokens, settings.candidates, settings.bank_size) == (
        ",".join(lab.NEUTRAL),
        10,
        8,
    )
    # the relative threshold and the 512 rollouts a route of its stated calculation
    assert (settings.tolerance_mode, settings.tolerance) == ("relative", 0.6)
    assert settings.probe_prompts * settings.probe_samples == 512
    tok = Tokenizer.from_hf_folder(spec.model.path)
    ids = eden.EDEN(settings, spec).pool_ids(tok)
    assert [tok.decode([i]) for i in ids] == list(lab.NEUTRAL)
    few = dataclasses.replace(settings, pool_tokens="a,b")
    with pytest.raises(ValueError, match="eden.pool_tokens has 2 tokens, bank_size=8"):
        eden.EDEN.check(few, spec)
    with pytest.raises(ValueError, match="eden.pool_tokens: 'ab' is 2 tokens"):
        eden.EDEN(dataclasses.replace(settings, pool_tokens="ab"), spec).pool_ids(tok)
    v1 = config_lib.resolve(config_lib.load("configs/eden.py:lab"))
    ((_, settings),) = v1.methods
    assert settings.pool_tokens == "" and settings.bank_size == 8
    assert (settings.tolerance_mode, settings.tolerance) == ("absolute", 0.1)
    assert len(eden.EDEN(settings, v1).pool_ids(Tokenizer.from_hf_folder(lab.FOLDER))) == 20


def test_a_pool_larger_than_the_training_set_or_smaller_than_a_batch_is_refused(tmp_path):
    from configs import lab as lab_config
    from explore_rl import config as config_lib
    from explore_rl.train import loop

    c = lab_config.smoke(lab_config.get_config("demo"))
    c.model.base, c.model.random_init = "", "lab-1m"
    c.task.name, c.task.countdown.inputs, c.task.train_size = "countdown", 4, 20
    c.rollout.pool = 21
    with pytest.raises(ValueError, match=r"rollout.pool=21: above the task's 20 training"):
        loop.train(config_lib.spec(c), str(tmp_path))
    c.rollout.pool = c.rollout.prompts - 1
    with pytest.raises(ValueError, match=r"rollout.pool=1: below rollout.prompts=2, so a"):
        loop.train(config_lib.spec(c), str(tmp_path))

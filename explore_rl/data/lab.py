"""The lab's files. Its vocabulary: what the synthetic tasks (countdown, multistep) write,
one token a character, as a standard tokenizer folder in the project's `data/lab/`
(`write_tokenizer`). A lab model is a preset's random weights with this tokenizer
(`model.path = FOLDER`, `model.random_init = "lab-1m"`), trained from scratch like any
other model. Its fixed splits: Countdown's training and test problems at the default
difficulty, drawn once and written to `data/countdown/` (`write_splits`; the preset
`countdown` reads them), so every run, seed and method of a study reads the same files,
and config.json records their digests. Tests hold the committed files to both functions.

Lab v2's vocabulary (`V2_FOLDER`, `configs/lab.py:lab2`) adds `NEUTRAL`: characters no
task writes, the ids the lab model's 32-row embedding left unused. SFT puts one of them
between the prompt and the response of a share of its examples (`sft.neutral_share`), so
the base model learns to read past one, where EDEN appends its anchor (docs/lab.md).
"""

from __future__ import annotations

import json
import os

from explore_rl.data import countdown
from explore_rl.data.jsonl import DATA_DIR
from explore_rl.models.tokenizer import Tokenizer

# digits, the operators and what the questions and answers write around them
ALPHABET = "0123456789+-*/=()> \n"
# lab v2's neutral tokens: after the pad and EOS tokens and ALPHABET, ids 22 to 31
NEUTRAL = "abcdefghij"
FOLDER = os.path.join(DATA_DIR, "lab")
V2_FOLDER = os.path.join(DATA_DIR, "lab2")
SPLITS_FOLDER = os.path.join(DATA_DIR, "countdown")
SPLIT_SIZES = {"train": 20000, "test": 512}


def tokenizer(alphabet: str = ALPHABET) -> Tokenizer:
    return Tokenizer.character_level(alphabet)


def write_tokenizer(folder: str = FOLDER, alphabet: str = ALPHABET) -> None:
    """`tokenizer.json`, `tokenizer_config.json` and `generation_config.json` (EOS as the
    stop token) of the lab's tokenizer (`alphabet`: lab v2's is ALPHABET + NEUTRAL, in
    V2_FOLDER), in `folder`."""
    os.makedirs(folder, exist_ok=True)
    tok = tokenizer(alphabet)
    tok.save_hf_folder(folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [tok.eos_id], "pad_token_id": tok.pad_id}, f, indent=2)


def write_splits(folder: str = SPLITS_FOLDER) -> None:
    """`train.jsonl` and `test.jsonl` of Countdown at its default settings (`SPLIT_SIZES`
    problems each, drawn from `problems_seed` 0): question, answer and the canonical
    solution ("" where there is none), one problem a line."""
    os.makedirs(folder, exist_ok=True)
    for split, n in SPLIT_SIZES.items():
        problems = countdown.make_countdown(n, 0, split, countdown.Spec())
        with open(os.path.join(folder, f"{split}.jsonl"), "w") as f:
            for p in problems:
                row = {"question": p.question, "answer": p.answer, "solution": p.solution}
                f.write(json.dumps(row) + "\n")

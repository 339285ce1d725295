"""The lab's vocabulary: what the synthetic tasks (countdown, multistep) write, one token a
character, as a standard tokenizer folder in the project's `data/lab/` (written by
`write_tokenizer`; a test holds the committed files to it). A lab model is a preset's
random weights with this tokenizer (`model.path = FOLDER`, `model.random_init = "lab-1m"`),
trained from scratch like any other model.
"""

from __future__ import annotations

import json
import os

from explore_rl.data.jsonl import DATA_DIR
from explore_rl.models.tokenizer import Tokenizer

# digits, the operators and what the questions and answers write around them
ALPHABET = "0123456789+-*/=()> \n"
FOLDER = os.path.join(DATA_DIR, "lab")


def tokenizer() -> Tokenizer:
    return Tokenizer.character_level(ALPHABET)


def write_tokenizer(folder: str = FOLDER) -> None:
    """`tokenizer.json`, `tokenizer_config.json` and `generation_config.json` (EOS as the
    stop token) of the lab's tokenizer, in `folder`."""
    os.makedirs(folder, exist_ok=True)
    tok = tokenizer()
    tok.save_hf_folder(folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [tok.eos_id], "pad_token_id": tok.pad_id}, f, indent=2)

"""A run's starting weights made by supervised fine-tuning, once per machine (`model.base`).

The lab's RL runs start from a model fine-tuned on the task's solutions (configs/lab.py).
Rather than asking every run, seed and method to repeat that SFT run, `model.base` names
the SFT config (`configs/lab.py:sft,demo`); the first run on a machine trains it and writes
its final weights as a Hugging Face folder in the user's cache, keyed by the SFT run's
resolved config (its recipe), and every later run reads that folder as `model.path`, as
the converted GGUF is read. The recipe takes the run's own `task` section, so a run at
another difficulty gets a base model trained on its own problems.

    c = base_model.resolve(c)   # model.path: the cached base (built first if missing)

Where: `caching.cache_dir("base", <recipe>)`, beside it `<recipe>.run/` (the SFT run's
logs and checkpoints: an interrupted build resumes) and `<recipe>.lock` (concurrent runs
of a sweep wait for one build rather than racing).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os

from explore_rl import caching
from explore_rl import config as config_lib
from explore_rl.models import lora, weights
from explore_rl.spec import SCHEDULING
from explore_rl.train import sft

_FORMAT = "v1"  # bump when what a recipe builds changes


def recipe(c):
    """The SFT config that makes run `c`'s base model: `model.base` with `c`'s task."""
    out = config_lib.load(c.model.base)
    if out.model.base:
        raise ValueError(f"model.base={c.model.base!r}: its own model.base must be empty")
    out.task = copy.deepcopy(c.task)
    return out


# sections an SFT run reads for nothing its weights depend on (its evaluations draw from
# their own keys): a setting added to them does not make every machine train the base again
UNTRAINED = ("eval", "logging", "export", "sample", "exploration")


# settings added since bases were first built, left out of the key at these values (what
# the bases built before them did): a base built before them keeps its name
ADDED = {"rollout.pool": 0, "task.countdown.other_share": 0.0, "sft.neutral_share": 0.0,
         "sft.neutral_tokens": ""}  # fmt: skip


def key(sft_config) -> str:
    """The recipe's name in the cache: a digest of its resolved config but the
    UNTRAINED sections, the scheduling settings (`spec.SCHEDULING`) and the ADDED ones at
    their old values, with its model folder named by its files' contents rather than where
    it lies (the lab's is inside the checkout: every clone of one tree shares one build),
    and the format."""
    recipe_ = config_lib.resolved(sft_config).to_dict()
    recipe_["model"]["path"] = _contents(recipe_["model"]["path"])
    for section in UNTRAINED:
        recipe_.pop(section, None)
    for setting in SCHEDULING:  # how it runs, not what it trains
        section, name = _section(recipe_, setting)
        section.pop(name, None)
    for setting, old in ADDED.items():
        section, name = _section(recipe_, setting)
        if section.get(name, old) == old:
            section.pop(name, None)
    text = json.dumps(recipe_, sort_keys=True)
    return hashlib.sha256(f"{_FORMAT}\n{text}".encode()).hexdigest()[:20]


def _section(recipe_: dict, setting: str) -> tuple[dict, str]:
    """(the dict holding dotted `setting`, its last name); {} where a level is missing."""
    *path, name = setting.split(".")
    for part in path:
        recipe_ = recipe_.get(part, {})
    return recipe_, name


def _contents(path: str):
    """A folder's files as {name: sha256}, a file's sha256, or the path itself (a name such
    as the embedded model's)."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
        return {n: caching.file_digest(os.path.join(path, n)) for n in names}
    return caching.file_digest(path) if os.path.isfile(path) else path


def build(sft_config) -> str:
    """The base model folder of `sft_config`: from the cache, or trained and written there."""
    name = key(sft_config)
    final = caching.cache_dir("base", name)

    def train(folder: str) -> None:
        logging.warning("base model %s: training it once (%s)", name, final + ".run")
        spec = config_lib.spec(sft_config, "sft")
        progress = sft.train_sft(spec, final + ".run")
        cfg, _ = spec.model.config()
        params = lora.merged(progress.state.params, cfg)  # a LoRA run's, folded in
        weights.save_hf(folder, params, cfg, "float32", 2**31)
        weights.copy_tokenizer(spec.model.path, folder)
        with open(os.path.join(folder, config_lib.RECIPE_FILE), "w") as f:
            json.dump(config_lib.resolved(sft_config).to_dict(), f, indent=2)

    return caching.build_alone(final, train)


def resolve(c):
    """`c` with `model.path` its base model (`build`) when `model.base` names one; else `c`."""
    if not c.model.base:
        return c
    out = copy.deepcopy(c)
    out.model.path, out.model.random_init = build(recipe(c)), ""
    return out

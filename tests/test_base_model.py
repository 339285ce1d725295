"""A run's base model (`model.base`, train/base_model.py): the SFT recipe of
configs/lab.py is trained once per machine and every later run reads the same folder,
whose weights are the SFT run's last ones; another task is another recipe; a config.json
records the digests of the data files a run reads."""

import json
import os

import jax
import numpy as np
import pytest

from configs import lab
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.data import jsonl
from explore_rl.train import base_model, loop, sft


@pytest.fixture
def counted_sft(tmp_path, monkeypatch):
    """SFT runs counted, their progress kept; the base models in a cache of this test's."""
    monkeypatch.setenv("EXPLORE_RL_CACHE_DIR", str(tmp_path / "cache"))
    runs = []
    train = sft.train_sft

    def counting(c, workdir):
        runs.append(train(c, workdir))
        return runs[-1]

    monkeypatch.setattr(sft, "train_sft", counting)
    return runs


def test_a_recipe_is_trained_once_and_every_run_starts_from_its_last_weights(counted_sft):
    rl = lab.get_config("smoke")
    first = base_model.resolve(rl)
    again = base_model.resolve(lab.get_config("smoke"))
    assert len(counted_sft) == 1 and first.model.path == again.model.path
    assert rl.model.path == lab.lab.FOLDER  # the caller's config is not changed
    start, _, _ = config_lib.resolve(first).model.load(0)
    trained = counted_sft[0].state.params
    for x, y in zip(jax.tree.leaves(trained), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # float32 written as is
    with open(os.path.join(first.model.path, "recipe.json")) as f:
        assert json.load(f)["train"]["steps"] == lab.get_config("sft,smoke").train.steps


def test_a_recipe_is_named_by_what_it_trains_not_by_its_place(tmp_path, monkeypatch):
    """Each clone of the tree (a worktree, CI's clean clone) shares the lab's base model:
    the recipe's model folder, inside the checkout, is keyed by its files."""
    import shutil

    monkeypatch.setenv("EXPLORE_RL_CACHE_DIR", str(tmp_path / "cache"))
    here = base_model.recipe(lab.get_config("smoke"))
    copy = shutil.copytree(here.model.path, tmp_path / "elsewhere" / "lab")
    there = base_model.recipe(lab.get_config("smoke"))
    there.model.path = str(copy)
    assert base_model.key(here) == base_model.key(there)
    with open(copy / "tokenizer.json", "a") as f:  # another vocabulary: another model
        f.write(" ")
    assert base_model.key(here) != base_model.key(there)
    # an evaluation's setting changes nothing the SFT trains; a learning rate does
    quieter = base_model.recipe(lab.get_config("smoke"))
    quieter.eval.samples, quieter.logging.name = 3, "another"
    quieter.rollout.decode_chunk, quieter.model.remat = 7, "block"  # how it runs
    assert base_model.key(quieter) == base_model.key(here)
    quieter.optim.lr *= 2
    assert base_model.key(quieter) != base_model.key(here)


def test_settings_added_since_leave_the_lab_bases_name():
    """The lab's base keeps the name it was built under, so no machine trains it again
    (~7 min) because a setting was added (`base_model.ADDED`); an added setting away from
    its old value names another base. Renaming it on purpose: `base_model._FORMAT`."""
    recipe = base_model.recipe(config_lib.load("configs/grpo.py:lab"))
    assert base_model.key(recipe) == "b3001004a65b998e870f"
    recipe.task.countdown.other_share = 0.1
    assert base_model.key(recipe) != "b3001004a65b998e870f"


@pytest.mark.slow
def test_another_task_is_another_recipe_and_its_run_trains_on_it(counted_sft, tmp_path):
    rl = lab.get_config("smoke")
    rl.task.name, rl.task.countdown.inputs, rl.task.train_size = "countdown", 4, 64
    rl.reward.fn = testing.PARITY  # mixed groups: the step updates
    assert base_model.key(base_model.recipe(rl)) != base_model.key(
        base_model.recipe(lab.get_config("smoke"))
    )
    with pytest.raises(ValueError, match="^config: model.base=configs/lab.py:sft,smoke: not built"):
        loop.train(config_lib.spec(rl), str(tmp_path / "rl"))
    progress = loop.train(config_lib.spec(base_model.resolve(rl)), str(tmp_path / "rl"))
    assert (
        len(counted_sft) == 1 and int(progress.data_position) == rl.train.steps * rl.rollout.prompts
    )
    assert counted_sft[0].data_position > 0
    with open(tmp_path / "rl" / "config.json") as f:
        model = json.load(f)["model"]
    assert model["base"] == "configs/lab.py:sft,smoke" and model["path"].startswith(
        str(tmp_path / "cache")
    )


def test_a_recipe_that_names_a_base_itself_is_refused():
    rl = lab.get_config("smoke")
    rl.model.base = "configs/lab.py:smoke"  # the RL variant: it has a base of its own
    with pytest.raises(ValueError, match="its own model.base must be empty"):
        base_model.recipe(rl)


def test_config_json_records_the_digest_of_every_data_file_read():
    spec = config_lib.spec(lab.get_config("sft,smoke"))
    train, tests = jsonl.files(spec.task)
    digests = spec.record["task"]["digests"]
    assert set(digests) == {train, *tests} and all(len(d) == 64 for d in digests.values())

"""Every config in configs/ with every argument loads from any directory, through the
library and through the command line, and config.json records the resolved config."""

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
from helpers import subprocess_env

import configs
from configs import base, controls
from explore_rl.exploration import base as exploration
from explore_rl.models.lora import LoraConfig


class _Read(Exception):
    pass


def _arguments(file: str) -> list[str]:
    """Every argument of `configs/<file>`, from what its `get_config` gives
    `base.parse_arg` (the one reader of a config's argument): none, each scale, each
    variant alone and at each scale (without a variant, unless one is required). A file
    that reads no argument takes none."""

    def read(arg, file, variants=(), require_variant=False, scales=base.SCALES):
        raise _Read(variants, require_variant, scales)

    with mock.patch.object(base, "parse_arg", read):
        try:
            importlib.import_module(f"configs.{file[:-3]}").get_config()
        except _Read as r:
            variants, require_variant, scales = r.args
        else:
            return [file]
    plain = [] if require_variant else [file] + [f"{file}:{s}" for s in scales]
    return plain + [f"{file}:{v}{s}" for v in variants for s in ["", *(f",{s}" for s in scales)]]


# Every argument of every file in configs/ (a new config is found, and loaded, as it is).
SPECS = {
    name: _arguments(name)
    for name in sorted(os.listdir(os.path.dirname(configs.__file__)))
    if name.endswith(".py") and name != "__init__.py"
}

LOAD_ALL = """
import json, sys
from explore_rl import config
for spec in json.loads(sys.argv[1]):
    c = json.loads(config.resolved(config.load(spec)).to_json())
    print(json.dumps({"spec": spec, "config": c}))
"""


def _python_in(folder, *args):
    """`python ARGS` run in `folder` with the installed package alone (no PYTHONPATH), as
    a notebook or a launcher elsewhere would have it."""
    return subprocess.run(
        [sys.executable, *args], cwd=folder, env=subprocess_env(tests_importable=False),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_every_config_and_argument_loads_from_another_directory(tmp_path):
    specs = [f"configs/{s}" for group in SPECS.values() for s in group]
    out = _python_in(tmp_path, "-c", LOAD_ALL, json.dumps(specs))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["spec"]: r["config"] for r in map(json.loads, out.stdout.splitlines())}
    assert list(rows) == specs
    # an ablation alone means the demo scale, and either order of the arguments is one config
    assert rows["configs/eden.py:no_anchor"] == rows["configs/eden.py:no_anchor,demo"]
    assert rows["configs/eden.py:no_anchor"]["exploration"]["eden"]["anchor"] == "none"
    assert rows["configs/controls.py:gspo"] == rows["configs/controls.py:gspo,demo"]
    # the resolved config holds each method's defaults: every field of its section
    for spec, c in rows.items():
        for name in c["exploration"]["methods"]:
            assert set(c["exploration"][name]) == set(exploration.get(name).defaults()), spec


@pytest.mark.slow
def test_the_command_line_finds_configs_from_another_directory(tmp_path):
    out = _python_in(
        tmp_path,
        "-m",
        "explore_rl.main",
        "--mode=sample",
        "--config",
        "configs/ead.py:smoke",
        "--workdir",
        str(tmp_path / "run"),
        "--config.sample.num_prompts=1",
        "--config.sample.max_new_tokens=4",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    written = json.load(open(tmp_path / "run" / "config.json"))
    assert written["exploration"]["ead"]["convention"] == "paper"  # a default, recorded
    assert written["sample"]["max_new_tokens"] == 4


# Every value of the `paper` configs that a paper states, with where it states it (tables in
# docs/methods.md). A change to one of these is a change to what "the paper's setting"
# means: it must cite a source.
def _paper_values() -> list[tuple]:
    """(config, setting, ours, source) of every row of docs/methods.md's tables of the
    papers' values: the one home of each value's source."""
    rows = []
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "methods.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not re.fullmatch(r"`\w+\.py:[\w,]+`", cells[0]):
                continue
            assert len(cells) == 5, f"docs/methods.md: a row of 5 cells: {line!r}"
            spec, key, _, ours, source = (c.strip("`") for c in cells)
            rows.append((spec, key, ast.literal_eval(ours), source))
    return rows


PAPER_VALUES = _paper_values()


@pytest.mark.parametrize("spec,key,value,source", PAPER_VALUES)
def test_paper_configs_hold_their_sources_values(spec, key, value, source):
    from explore_rl import config as config_lib

    c = config_lib.resolved(config_lib.load(f"configs/{spec}"))
    section, field = key.rsplit(".", 1)
    for part in section.split("."):
        c = c[part]
    assert c[field] == value, f"{spec} {key}: {source}"


def test_score_temperature_follows_the_rollout_or_a_number():
    from configs import grpo
    from explore_rl import config as config_lib

    c = grpo.get_config("smoke")
    assert c.rl.score_temperature == "rollout" and c.rl.tis_level == "token"  # verl's
    assert config_lib.loss_config(c).score_temperature == 1.0
    assert config_lib.loss_config(controls.get_config("temperature")).score_temperature == 1.2
    c.rl.score_temperature = "1.0"
    c.rollout.temperature = 1.2
    assert config_lib.loss_config(c).score_temperature == 1.0
    c.rl.score_temperature = "hot"
    with pytest.raises(ValueError, match="rl.score_temperature='hot': 'rollout' or a number"):
        config_lib.spec(c)
    c.rl.score_temperature, c.rollout.temperature = "rollout", 0.0
    with pytest.raises(ValueError, match="greedy rollouts"):
        config_lib.spec(c)


def test_the_run_spec_holds_every_field_of_the_run_once():
    """`config.spec` gives every field of the sections the run reads one typed home with
    the config's value (the rest are derived: the task's resolved name, the reward's
    function, the score temperature as a number, Dr.GRPO's normaliser, the model's stop
    ids, the evaluation's decode slots: the rollout's until a run sizes them, its swept
    temperatures parsed), and every method's settings; a section field with no home, or a
    home with no field, fails."""
    import dataclasses

    from explore_rl import config as config_lib
    from explore_rl.logs import flatten
    from explore_rl.sampling.engine import EngineConfig
    from explore_rl.sampling.sampler import SamplingConfig

    c = config_lib.load("configs/eden.py:demo")
    c.exploration.methods = ("eden", "ead")
    c.rl.kl_coef, c.rl.tis_cap, c.optim.lr, c.rollout.top_k = 0.05, 2.0, 3e-6, 20  # not defaults
    c.model.lora.rank, c.model.lora.targets = 4, "q,down"
    s = config_lib.spec(c)
    homes = {
        "model": [s.model], "task": [s.task], "rollout": [s.rollout], "train": [s.train],
        "eval": [s.eval], "mesh": [s.mesh], "optim": [s.optim], "rl": [s.update, s.loss],
        "reward": [s.reward], "sample": [s.sample], "export": [s.export], "sft": [s.sft],
    }  # fmt: skip
    derived = {"task.name", "task.own", "rl.score_temperature", "rl.max_response_len", "reward.fn",
               "reward.weights", "rollout.stop_ids", "eval.stop_ids", "sample.stop_ids",
               "eval.slots", "eval.decode_chunk", "eval.decode_window", "eval.top_k",
               "eval.temperatures", "model.lora", "model.lora_path", "model.origin"}  # fmt: skip
    library = (SamplingConfig, EngineConfig)  # a section's objects: their fields, by config name
    renamed = {"chunk": "decode_chunk", "window": "decode_window"}

    def fields(section, typed):
        out = {}
        for t in typed:
            for f in dataclasses.fields(t):
                value = getattr(t, f.name)
                if isinstance(value, library):
                    out.update(fields(section, [value]))
                else:
                    out[f"{section}.{renamed.get(f.name, f.name)}"] = value
        return out

    for section, typed in homes.items():
        held = fields(section, typed)
        given = {k: v for k, v in flatten(c.to_dict()).items() if k.startswith(section + ".")}
        given = {k: v for k, v in given.items() if not {k, k.rsplit(".", 1)[0]} & derived}
        assert held.keys() - derived <= given.keys(), section  # no home without a field
        for key, value in given.items():
            if key == "reward.extractors":  # a comma-separated string, split once
                assert held[key] == tuple(value.split(",")), key
            elif key not in ("reward.name",):  # the name (or fn, weights) build `reward.fn`
                assert held[key] == value, key
    assert s.model.lora == LoraConfig(4, c.model.lora.alpha, ("q", "down"), rslora=False)
    assert s.eval.engine == s.rollout.engine  # until a run sizes an evaluation batch's
    assert s.loss.score_temperature == 1.0 and s.loss.max_response_len == 32
    (math,) = s.reward.fn.functions
    assert s.task.name == "arithmetic" and math.fn("\\boxed{3}", _Problem("3")) == 1.0
    assert [n for n, _ in s.methods] == ["eden", "ead"]
    eden_settings = dict(s.methods)["eden"]
    assert dataclasses.asdict(eden_settings) == config_lib.method_section(c, "eden").to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rollout.prompts = 1  # frozen: nothing below the entry point changes a setting


class _Problem:
    def __init__(self, answer):
        self.answer = answer


METHODS = ("ase", "ead", "eden", "extra")  # each with its configs/<method>.py


def _outside_methods(c) -> dict:
    """A config's settings but its methods' (flattened), to compare two configs' runs."""
    from explore_rl.logs import flatten

    return {k: v for k, v in flatten(c.to_dict()).items() if not k.startswith("exploration.")}


@pytest.mark.parametrize("scale", ["smoke", "demo", "lab", "lab2"])
def test_a_methods_run_settings_are_what_its_config_changes_from_grpos(scale):
    """`RUN_SETTINGS` names every setting outside a method's section that its config
    changes from configs/grpo.py's at the scales that share grpo's setting (the paper scale
    is each paper's own experiment), so a composition can check them all."""
    from explore_rl import config as config_lib

    grpo = _outside_methods(config_lib.load(f"configs/grpo.py:{scale}"))
    for name in METHODS:
        own = _outside_methods(config_lib.load(f"configs/{name}.py:{scale}"))
        changed = {k for k in own if own[k] != grpo.get(k)}
        declared = set(importlib.import_module(f"configs.{name}").RUN_SETTINGS)
        if name == "extra" and scale == "smoke":  # the smoke run's 16 tokens, not ExTra's
            changed -= {"rollout.max_new_tokens"}
        assert changed == declared, name


@pytest.mark.parametrize("scale", ["lab", "lab2", "paper"])
def test_every_pair_of_composed_methods_runs_with_each_ones_settings_at_the_scale(scale):
    """A method composed onto another's config (`exploration.methods` overridden) gets its
    own config's section at that scale, and the settings that go with it (EAD's and ASE's
    TIS cap) or a one-line refusal naming the setting to give; given it, the run's methods
    are each its own config's."""
    from explore_rl import config as config_lib
    from explore_rl.exploration import base as exploration_lib

    alone = {m: config_lib.load(f"configs/{m}.py:{scale}") for m in METHODS}
    for first in METHODS:
        for second in METHODS:
            if first == second:
                continue
            c = config_lib.load(f"configs/{first}.py:{scale}")
            c.exploration.methods = (first, second)
            try:
                spec = config_lib.resolve(c)
            except ValueError as e:
                (line,) = str(e).splitlines()
                key, value = re.search(r"set --config\.(\w+\.\w+)=(\S+)$", line).groups()
                section, field = key.split(".")
                assert alone[second][section][field] == ast.literal_eval(value) != c[section][field]
                c[section][field] = ast.literal_eval(value)
                spec = config_lib.resolve(c)
            exploration_lib.check(spec)  # no two claim the same intervention
            for m in (first, second):
                want = dict(config_lib.resolve(alone[m]).methods)[m]
                assert dict(spec.methods)[m] == want, (first, second, m)
                for key in importlib.import_module(f"configs.{m}").RUN_SETTINGS:
                    section, field = key.split(".")
                    assert c[section][field] == alone[m][section][field], (first, second, key)
            assert config_lib.resolved(c).exploration[second] == config_lib.method_section(
                alone[second], second
            )


def test_the_lab_eden_ead_composition_is_refused_without_eads_tis_cap():
    """The documented composition, at the lab scale: EAD's lab schedule (d0 3.75, c 1),
    and without EAD's TIS cap the run says which setting to give."""
    from explore_rl import config as config_lib

    c = config_lib.load("configs/eden.py:lab")
    c.exploration.methods = ("eden", "ead")
    with pytest.raises(ValueError, match=r"ead at the lab scale .* set --config.rl.tis_cap=2.0$"):
        config_lib.resolve(c)
    c.rl.tis_cap = 2.0
    ead = dict(config_lib.resolve(c).methods)["ead"]
    assert (ead.d0, ead.c) == (3.75, 1)

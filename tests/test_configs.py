"""Every config in configs/ with every argument loads from any directory, through the
library and through the command line, and config.json records the resolved config."""

import json
import os
import subprocess
import sys

import pytest

import configs
from configs import ase, base, controls, eden, extra
from explore_rl.exploration import base as exploration

SPECS = {
    "base.py": ["base.py"],
    "grpo.py": [f"grpo.py:{s}" for s in base.SCALES] + ["grpo.py"],
    "ead.py": [f"ead.py:{s}" for s in base.SCALES],
    "eden.py": [f"eden.py:{s}" for s in base.SCALES]
    + [f"eden.py:{a}" for a in eden.ABLATIONS]
    + [f"eden.py:{a},{s}" for a in eden.ABLATIONS for s in base.SCALES],
    "ase.py": [f"ase.py:{s}" for s in base.SCALES]
    + [f"ase.py:{a},{s}" for a in ase.ABLATIONS for s in base.SCALES],
    "extra.py": [f"extra.py:{s}" for s in base.SCALES]
    + [f"extra.py:{v},{s}" for v in extra.VARIANTS for s in base.SCALES],
    "controls.py": [f"controls.py:{k}" for k in controls.CONTROLS]
    + [f"controls.py:{k},{s}" for k in controls.CONTROLS for s in base.SCALES],
}

LOAD_ALL = """
import json, sys
from explore_rl import config
for spec in json.loads(sys.argv[1]):
    c = json.loads(config.resolved(config.load(spec)).to_json())
    print(json.dumps({"spec": spec, "config": c}))
"""


def test_the_table_covers_every_config_file():
    folder = os.path.dirname(configs.__file__)
    names = {n for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py"}
    assert names == set(SPECS)


def _python_in(folder, *args):
    """`python ARGS` run in `folder` with the installed package alone (no PYTHONPATH), as
    a notebook or a launcher elsewhere would have it."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


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


# Every value of the `paper` configs that a paper states, with where it states it. A change
# to one of these is a change to what "the paper's setting" means: it must cite a source.
PAPER_VALUES = [
    # configs/grpo.py:paper = EDEN's GRPO baseline (EDEN paper, training setup)
    ("grpo.py:paper", "rollout.prompts", 128, "EDEN paper: batch size 128"),
    ("grpo.py:paper", "rollout.group_size", 16, "EDEN paper: 16 rollouts per prompt"),
    ("grpo.py:paper", "rl.eps_low", 0.2, "EDEN paper: eps_low 0.2"),
    ("grpo.py:paper", "rl.eps_high", 0.28, "EDEN paper: eps_high 0.28"),
    ("grpo.py:paper", "rl.kl_coef", 0.0, "EDEN paper: beta 0"),
    ("grpo.py:paper", "rl.entropy_coef", 0.001, "EDEN paper: alpha 0.001"),
    ("grpo.py:paper", "optim.lr", 1e-6, "EDEN paper: learning rate 1e-6"),
    ("grpo.py:paper", "train.steps", 2000, "EDEN paper: about 2000 steps for the math models"),
    ("grpo.py:paper", "eval.temperature", 0.6, "EDEN paper: evaluation temperature 0.6"),
    ("grpo.py:paper", "eval.top_p", 0.95, "EDEN paper: evaluation top-p 0.95"),
    ("grpo.py:paper", "eval.samples", 8, "EDEN paper: Pass@8"),
    ("grpo.py:paper", "rl.score_temperature", "rollout", "verl, the EDEN paper's framework"),
    # configs/eden.py:paper adds EDEN (EDEN paper, method) to that baseline
    ("eden.py:paper", "exploration.eden.noisy", 4, "EDEN paper: 12 clean + 4 noisy of 16"),
    ("eden.py:paper", "exploration.eden.rho", 0.18, "EDEN paper: rho 0.18 for the math models"),
    ("eden.py:paper", "exploration.eden.warmup", 200, "EDEN paper: warm-up 200 steps at 1.5B"),
    ("eden.py:paper", "exploration.eden.tau_start", 0.2, "EDEN paper: cosine 0.2 -> 1.0"),
    ("eden.py:paper", "exploration.eden.bank_size", 8, "EDEN paper: K = 8 anchors"),
    ("eden.py:paper", "exploration.eden.keep", 0.5, "EDEN paper: top p = 0.5 of noisy |A|"),
    ("eden.py:paper", "exploration.eden.gamma", 0.5, "EDEN paper: gamma 0.5"),
    ("eden.py:paper", "rl.tis_cap", 0.0, "EDEN paper: no importance correction"),
    ("eden.py:paper", "rollout.prompts", 128, "EDEN paper: batch size 128"),
    ("eden.py:paper", "train.steps", 2000, "EDEN paper: about 2000 steps"),
    # configs/ead.py:paper = EAD paper, Sec. 5.1 and App. A, Table 1
    ("ead.py:paper", "rollout.prompts", 1024, "EAD paper Table 1: training batch size 1024"),
    ("ead.py:paper", "rollout.max_prompt_len", 1024, "EAD paper Table 1: max prompt 1024"),
    ("ead.py:paper", "rollout.max_new_tokens", 3072, "EAD paper Table 1: max response 3072"),
    ("ead.py:paper", "rl.minibatches", 4, "EAD paper Table 1: mini-batch 256 of 1024"),
    ("ead.py:paper", "optim.lr", 1e-6, "EAD paper Table 1: learning rate 1e-6"),
    ("ead.py:paper", "rollout.group_size", 8, "EAD paper Sec. 5.3: n = 8"),
    ("ead.py:paper", "rollout.dynamic_sampling", False, "EAD paper Sec. 5.1: disabled"),
    ("ead.py:paper", "rl.kl_coef", 0.0, "EAD paper Sec. 5.1: the DAPO framework, no KL"),
    ("ead.py:paper", "rl.entropy_coef", 0.0, "EAD paper Sec. 5.1: the DAPO framework"),
    ("ead.py:paper", "rl.eps_high", 0.28, "EAD paper Sec. 5.1: DAPO's clip-higher"),
    ("ead.py:paper", "rl.aggregation", "token_mean", "EAD paper Sec. 5.1: DAPO's token mean"),
    ("ead.py:paper", "rl.tis_cap", 2.0, "EAD paper App. B: c_IS = 2"),
    ("ead.py:paper", "eval.samples", 16, "EAD paper Sec. 5.2: Pass@16, Worst@16"),
    ("ead.py:paper", "exploration.ead.tau_max", 1.2, "EAD paper Sec. 5.1: tau_max 1.2"),
    ("ead.py:paper", "exploration.ead.tau_min", 0.1, "EAD paper Sec. 5.1: 0.1 for 1B / 1.5B"),
    ("ead.py:paper", "exploration.ead.d0", 25.0, "EAD paper Sec. 5.1: d0 25"),
    ("ead.py:paper", "exploration.ead.c", 10, "EAD paper Sec. 3: c = 10"),
    ("ead.py:paper", "exploration.ead.first_token", 1, "EAD paper Sec. 3: the t-th token"),
    ("ead.py:paper", "exploration.ead.convention", "paper", "EAD paper Sec. 3: k = 1"),
    # configs/ase.py:paper = ASE paper, Sec. 3-4 and App. B-D
    ("ase.py:paper", "rollout.prompts", 64, "ASE paper Sec. 4.1: training batch 64"),
    ("ase.py:paper", "rl.minibatches", 1, "ASE paper Sec. 4.1: actor mini-batch 64 of 64"),
    ("ase.py:paper", "rl.ppo_epochs", 1, "ASE paper Sec. 4.1 (verl's one pass)"),
    ("ase.py:paper", "train.steps", 1084, "ASE paper Sec. 4.1: 4 epochs of 17,390 / 64"),
    ("ase.py:paper", "rollout.max_prompt_len", 1024, "ASE paper Sec. 4.1: prompt 1024"),
    ("ase.py:paper", "rollout.max_new_tokens", 4096, "ASE paper Sec. 4.1: response 4096"),
    ("ase.py:paper", "rollout.group_size", 8, "ASE paper Sec. 4.1: 8 rollouts"),
    ("ase.py:paper", "optim.lr", 1e-6, "ASE paper: learning rate 1e-6"),
    ("ase.py:paper", "optim.weight_decay", 0.01, "ASE paper: AdamW weight decay 0.01"),
    ("ase.py:paper", "rollout.temperature", 1.0, "ASE paper: temperature 1.0"),
    ("ase.py:paper", "rl.kl_coef", 0.0, "ASE paper App. C.1: no KL loss"),
    ("ase.py:paper", "rl.entropy_coef", 0.0, "ASE paper App. C.1: no entropy term"),
    ("ase.py:paper", "rl.eps_high", 0.2, "ASE paper Eq. 10: one clip range"),
    ("ase.py:paper", "rl.tis_cap", 2.0, "ASE paper App. C.2: c_IS = 2, token level"),
    ("ase.py:paper", "rl.tis_level", "token", "ASE paper Eq. 9: per response position"),
    ("ase.py:paper", "exploration.ase.k", 3, "ASE paper: K = 3"),
    ("ase.py:paper", "exploration.ase.alpha", 0.5, "ASE paper Table 12: alpha 0.5"),
    ("ase.py:paper", "exploration.ase.layer", 0, "ASE paper App. C.2: block 0"),
    ("ase.py:paper", "exploration.ase.f", 0.25, "ASE paper App. D: f = 0.25"),
    ("ase.py:paper", "exploration.ase.beta", 0.5, "ASE paper Sec. 4.1: beta 0.5"),
    # training's d_PCA is not stated; 64 is App. D.3's inference-time sweep
    ("ase.py:paper", "exploration.ase.d_pca", 64, "ASE paper App. D.3: PCA dimension 64"),
    ("ase.py:paper", "exploration.ase.kmeans_init", 512, "ASE paper App. D: n_init 512"),
    ("ase.py:paper", "eval.samples", 8, "ASE paper App. B: Mean@8"),
    ("ase.py:paper", "eval.temperature", 0.6, "ASE paper App. B: temperature 0.6"),
    ("ase.py:paper", "eval.top_p", 0.95, "ASE paper App. B: top-p 0.95"),
    ("ase.py:paper", "train.eval_every", 100, "ASE paper App. B: every 100 steps"),
    ("ase.py:paper", "train.best_metric", "eval/math500/mean@8", "ASE paper App. B"),
    # configs/extra.py:paper = ExTra paper, Sec. 5 and App. B
    ("extra.py:paper", "rollout.prompts", 512, "ExTra paper App. B: batch size 512"),
    ("extra.py:paper", "rollout.group_size", 6, "ExTra paper App. B: G = 6"),
    ("extra.py:paper", "rollout.max_prompt_len", 2000, "ExTra paper App. B: prompt 2,000"),
    ("extra.py:paper", "rollout.max_new_tokens", 4096, "ExTra paper App. B: response 4,096"),
    ("extra.py:paper", "optim.lr", 3e-6, "ExTra paper App. B: learning rate 3e-6"),
    ("extra.py:paper", "train.steps", 250, "ExTra paper App. B: 250 steps"),
    ("extra.py:paper", "rl.kl_coef", 0.0, "ExTra paper App. B: beta 0"),
    ("extra.py:paper", "rl.entropy_coef", 0.0, "ExTra paper App. B: entropy coefficient 0"),
    ("extra.py:paper", "exploration.extra.gamma", 1.0, "ExTra paper App. B: gamma 1.0"),
    ("extra.py:paper", "exploration.extra.memory", 0, "ExTra paper App. B: memory 6 = G"),
    ("extra.py:paper", "exploration.extra.warmup", 30, "ExTra paper App. B.5: T_warm 30"),
    ("extra.py:paper", "exploration.extra.tau", 0.1, "ExTra paper App. B: tau 0.1"),
    ("extra.py:paper", "exploration.extra.max_prefixes", 128, "ExTra paper App. B.5: 128"),
    ("extra.py:paper", "exploration.extra.queue", 4096, "ExTra paper App. B.5: 4,096"),
    ("extra.py:paper", "exploration.extra.novelty_at", "after", "ExTra paper Sec. 4.1"),
    ("extra.py:paper", "exploration.extra.features", "minilm", "ExTra paper: all-MiniLM-L6-v2"),
    ("extra.py:paper", "exploration.extra.hard", "all_incorrect", "ExTra paper App. B.5"),
    ("extra.py:paper", "exploration.extra.guided_frac", 1 / 16, "ExTra paper Sec. 5.5: 136k"),
    ("extra.py:paper", "exploration.extra.last_tokens", 512, "ExTra public code (paper: none)"),
    ("extra.py:paper", "eval.samples", 16, "ExTra paper App. B.6: n = 16"),
    ("extra.py:paper", "eval.temperature", 0.7, "ExTra paper App. B.6: temperature 0.7"),
    ("extra.py:paper", "eval.top_p", 0.9, "ExTra paper App. B.6: top-p 0.9"),
    ("extra.py:paper", "eval.max_new_tokens", 31744, "ExTra paper App. B.6: 31,744 tokens"),
    # the controls (the EDEN paper's same-pipeline controls), at the paper scale
    ("controls.py:temperature,paper", "rollout.temperature", 1.2, "EDEN paper: T = 1.2"),
    ("controls.py:group,paper", "rollout.group_size", 32, "EDEN paper: 32 rollouts"),
]


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
        config_lib.validate(c)
    c.rl.score_temperature, c.rollout.temperature = "rollout", 0.0
    with pytest.raises(ValueError, match="greedy rollouts"):
        config_lib.validate(c)

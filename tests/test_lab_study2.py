"""results/lab/study2.py: each mechanism check on hand-made metrics (one that passes, one
that fails), the primary endpoint's verdict rule, the report's order (a method's checks
before its primary endpoint) on synthetic kept runs, and the runner end to end at smoke
size (kept files, a rerun that trains nothing, the report)."""

import gzip
import importlib.util
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "results", "lab"))
spec = importlib.util.spec_from_file_location(
    "study2", os.path.join(HERE, "..", "results", "lab", "study2.py")
)
study2 = importlib.util.module_from_spec(spec)
sys.modules["study2"] = study2  # its dataclasses look their module up
spec.loader.exec_module(study2)

STEPS = 60
METHODS = ("ead", "ase", "extra", "eden")
# a config made before `levels` existed, as the kept runs of the study's first seeds
EAD = {"tau_max": 1.2, "tau_min": 0.1, "d0": 3.75, "c": 1, "first_token": 1,
       "convention": "paper", "k": 0.0694, "at_eval": False}  # fmt: skip


def _rows(arm: str, good: bool) -> list[dict]:
    """A run's metrics: its method's mechanism metrics passing (`good`) or failing."""
    rows = []
    for s in range(1, STEPS + 1):
        r = {"step": s, "reward/mean": 0.2, "reward/accuracy": 0.25, "rollout/entropy": 0.5,
             "groups/zero_adv_frac": 0.4, "rollout/answer_disagreement": 0.3,
             "rollout/temperature": 1.0}  # fmt: skip
        if arm == "ead":  # the first token hot, the last cold: 0.15 apart, or 0.05
            r["rollout/temperature_first"] = 1.1 if good else 1.0
            r["rollout/temperature_last"] = 0.95
            r["rollout/temperature"] = 0.9
            r["policy/kl_mu_old"] = 0.01 if good else 0.08
            r["tis/mean"] = 1.0
        if arm == "ead_flat":  # every token at EAD's level of the step
            r["rollout/temperature_first"] = r["rollout/temperature_last"] = 0.9
            r["rollout/temperature"] = 0.9
            r["policy/kl_mu_old"] = 0.02
        if arm == "ase":  # 6 updates (or 3), alignment logged from the second update on
            r["ase/updates"] = min(s // 10, 6 if good else 3)
            if s % 10 == 0 and s >= 20:
                r["ase/alignment"] = 0.7 if good else 0.2
            r["policy/kl_mu_old"] = 0.01
        if arm == "extra":  # recalled only after step 40 (before: 0, not counted)
            r["extra/guided_rows"] = 8.0 if s > 30 and good else 0.0  # 8 of 128 rows: 1/16
            if s > 30 and good:
                r["extra/guided_solve_rate"] = 0.3
            r["extra/novelty_recalled"] = (0.8 if good else 0.3) if s > 40 else 0.0
            r["extra/prefix_recalled"] = (0.6 if good else 0.4) if s > 40 else 0.0
        if arm == "eden":  # noisy rows at 0.6 (or 0.2) of the clean rows' reward
            r["eden/reward_clean"], r["eden/reward_noisy"] = 0.5, 0.3 if good else 0.1
        rows.append(r)
    return rows


def _kept(root, arm, seed, pass64, good=True, viable=9, sweep=(0.1, 0.5), trained=1.0):
    """A kept run of study 2 (what `lab_study.keep` writes) with hand-made numbers, trained
    at temperature `trained` (its sweep at it as "rollout" where that is not 1)."""
    path = root / f"{arm}-s{seed}"
    os.makedirs(path)
    method = {"ead_flat": "ead"}.get(arm, arm)
    config = {"seed": seed, "train": {"steps": STEPS}, "task": {"train_size": 640},
              "rollout": {"group_size": 8, "prompts": 16, "temperature": trained},
              "exploration": {"methods": [method] if method in METHODS else []}}  # fmt: skip
    if method == "ead":
        config["exploration"]["ead"] = {
            **EAD,
            **({"levels": [0.9] * STEPS} if arm != "ead" else {}),
        }
    if arm == "ase":
        config["exploration"]["ase"] = {"k": 3, "routing": "bank"}
    if arm == "extra":
        config["exploration"]["extra"] = {"warmup": 30}
    if arm == "eden":  # 10 candidates, `viable` within the tolerance of the clean accuracy
        bank = {"clean_accuracy": 0.3, "tolerance": 0.1,
                "candidates": [{"id": i, "accuracy": 0.25 if i < viable else 0.1}
                               for i in range(10)]}  # fmt: skip
        (path / "eden_bank.json").write_text(json.dumps(bank))
    (path / "config.json").write_text(json.dumps(config))
    with gzip.open(path / "metrics.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in _rows(arm, good))
    final = {"step": STEPS, "sampling": {"samples": 64}, "eval/average/pass@1": 0.2,
             "eval/average/pass@8": 0.5, "eval/average/pass@64": pass64,
             "eval/average/worst@8": 0.1, "eval/average/solutions@64": 2.0 + seed,
             "eval/average/distinct4@4correct": 0.5, "eval/average/logdet": 9.0}  # fmt: skip
    (path / "eval.json").write_text(json.dumps(final))
    p1, p16 = sweep
    swept = {"step": STEPS, "sampling": {"samples": 16}}
    for label, t in (("0.6", 0.6), ("1", 1.0), *([("rollout", trained)] * (trained != 1))):
        swept.update({f"eval/average/T_{label}/temperature": t,
                      f"eval/average/T_{label}/pass@1": p1 * t,
                      f"eval/average/T_{label}/pass@16": p16 * t})  # fmt: skip
    (path / "eval_sweep.json").write_text(json.dumps(swept))
    (path / "responses.json").write_text(json.dumps({"distinct": 1.5, "other@64": 0.1}))
    machine = {"cpu": "test cpu", "avx512": False, "cores": 2, "commit": "abc"}
    (path / "machine.json").write_text(json.dumps(machine))


def _table(tmp_path, arm, good, **kw):
    from explore_rl import analysis

    for seed in range(3):
        _kept(tmp_path, arm, seed, 0.5, good, **kw)
    runs = {s: analysis.load_run(str(tmp_path / f"{arm}-s{s}")) for s in range(3)}
    return {arm: {s: study2.values(r) for s, r in runs.items()}}


@pytest.mark.parametrize("method", ["ead", "ase", "extra", "eden"])
def test_each_mechanism_check_passes_on_good_metrics_and_fails_on_bad(tmp_path, method):
    good = _table(tmp_path / "good", method, True)
    bad = _table(tmp_path / "bad", method, False, viable=7)
    judged = [c for c in study2.CHECKS if c.method == method and c.arm == method]
    thresholds = [c for c in judged if (c.low, c.high) != (None, None)]
    assert thresholds
    for c in thresholds:
        assert study2.check(c, good)[1] == "passed", c.key
        assert study2.check(c, bad)[1] == "failed", c.key
    assert not study2.mechanism_failed(method, good)
    assert study2.mechanism_failed(method, bad)
    for c in judged:
        if (c.low, c.high) == (None, None):  # reported, never judged
            assert study2.check(c, good)[1] == "reported", c.key


def test_the_checks_read_what_the_spec_names(tmp_path):
    ead = _table(tmp_path, "ead", True)["ead"][0]
    assert ead["profile"] == pytest.approx(0.15) and ead["kl_median"] == pytest.approx(0.01)
    assert ead["temperature"] == pytest.approx(0.9)  # the realised level, every step
    ase = _table(tmp_path, "ase", True)["ase"][0]
    # K = 3 routes + the clean one over 8 rows: 6 steered rows
    assert (ase["ase_updates"], ase["alignment"], ase["steered_share"]) == (6, 0.7, 0.75)
    extra = _table(tmp_path, "extra", True)["extra"][0]
    # after step 40 only (the 0s before it are left out); 8 guided rows of 16 x 8: 1/16
    assert (extra["novelty_recalled"], extra["prefix_recalled"]) == pytest.approx((0.8, 0.6))
    assert extra["guided_share"] == pytest.approx(1 / 16)
    eden = _table(tmp_path, "eden", True, viable=9)["eden"][0]
    assert eden["viable"] == 9 and eden["noisy_ratio"] == pytest.approx(0.6)
    # lab2's relative screen: viable at (1 - 0.6) x clean 0.025 = 0.01 or more, as recorded
    scores = (0.01, 0.009, 0.03)
    bank = {"clean_accuracy": 0.025, "tolerance": 0.6, "tolerance_mode": "relative",
            "candidates": [{"id": i, "accuracy": a} for i, a in enumerate(scores)]}  # fmt: skip
    (tmp_path / "eden-s0" / "eden_bank.json").write_text(json.dumps(bank))
    assert study2.lab_study.screened(str(tmp_path / "eden-s0"))[0] == 2


def test_edens_viable_count_must_hold_on_every_seed():
    (c,) = [c for c in study2.CHECKS if c.key == "viable"]
    assert study2.check(c, {"eden": {0: {"viable": 10}, 1: {"viable": 10}}})[1] == "passed"
    # the mean, 8.5, meets 8; seed 1's 7 does not
    stats, said = study2.check(c, {"eden": {0: {"viable": 10}, 1: {"viable": 7}}})
    assert (stats[0], said) == (8.5, "failed")
    assert study2.check(c, {"grpo": {0: {}}})[1] == "not measured"


def _stats(diffs):
    from explore_rl import analysis

    return (*analysis.t_interval(diffs), len(diffs))


def test_the_verdict_rule_on_each_branch():
    assert study2.verdict(_stats([0.03, 0.04, 0.05])) == "better"
    assert study2.verdict(_stats([-0.03, -0.04, -0.05])) == "worse"
    assert study2.verdict(_stats([-0.001, 0.0, 0.001])) == "no difference of 0.02 or more"
    assert study2.verdict(_stats([-0.1, 0.0, 0.1])) == "not resolved"
    # (-0.005, 0.025): above -0.02 but not below 0.02, and containing 0
    assert study2.verdict(_stats([0.004, 0.01, 0.016])) == "not resolved"
    assert study2.verdict(_stats([0.05])) == "not resolved"  # one seed: no interval
    assert study2.verdict(_stats([])) == "not measured"  # no seed paired
    # the paired t interval: mean 0.04, sd 0.01, t_{0.975, 2} = 4.303
    half = 4.302653 * 0.01 / 3**0.5  # t_{0.975, 2} x sd / sqrt(n)
    assert _stats([0.03, 0.04, 0.05])[:3] == pytest.approx((0.04, 0.04 - half, 0.04 + half))


def test_the_sweep_adds_the_runs_own_temperature_only_away_from_1():
    from explore_rl import config as config_lib

    _, sweep = study2.EVALUATIONS
    c = config_lib.load("configs/grpo.py:lab2")
    assert sweep.config(c, "x").eval.temperatures == "0.6,0.8,1.0,1.2"
    c.rollout.temperature = 0.7
    e = sweep.config(c, "x")
    assert (e.eval.temperatures, e.eval.samples, e.eval.diversity) == (
        "0.6,0.8,1.0,1.2,rollout",
        16,
        False,
    )
    assert (e.eval.checkpoint, e.eval.num_prompts, e.eval.temperature) == ("x", 0, 1.0)
    c.rollout.temperature = 1.2  # swept already: "rollout" would sample it twice
    assert sweep.config(c, "x").eval.temperatures == "0.6,0.8,1.0,1.2"


def test_ead_fixed_takes_the_kept_ead_runs_level_or_refuses(tmp_path):
    with pytest.raises(SystemExit, match=r"seeds \[0, 1, 2, 3, 4, 5, 6, 7\] are not kept"):
        study2.ead_level(str(tmp_path))
    for seed in study2.SEEDS[:-1]:
        _kept(tmp_path, "ead", seed, 0.5)  # 0.9 every step
    with pytest.raises(SystemExit, match=r"seeds \[7\] are not kept"):  # not part of them
        study2.ead_level(str(tmp_path))
    _kept(tmp_path, "ead", 7, 0.5)
    for seed in (4, 5, 6, 7):  # half the seeds at 0.934 every step
        with open(tmp_path / f"ead-s{seed}" / "metrics.jsonl.gz", "wb") as f:
            f.write(gzip.compress(b"".join(
                json.dumps({**r, "rollout/temperature": 0.934}).encode() + b"\n"
                for r in _rows("ead", True)
            )))  # fmt: skip
    assert study2.ead_level(str(tmp_path)) == 0.92  # (0.9 + 0.934) / 2 = 0.917


def test_each_arm_changes_one_thing_and_ead_fixed_runs_at_eads_level(tmp_path, monkeypatch):
    from explore_rl.train import base_model

    monkeypatch.setattr(base_model, "resolve", lambda c: c.copy_and_resolve_references())
    configs = {arm: study2.arm_config(arm, 3, str(tmp_path)) for arm in study2.STUDY}
    assert {a: c.rollout.temperature for a, c in configs.items()} == {
        "grpo": 1.0, "cold": 0.7, "hot": 1.2, "ead": 1.0, "ase": 1.0, "extra": 1.0, "eden": 1.0,
    }  # fmt: skip
    assert {a: tuple(c.exploration.methods) for a, c in configs.items()} == {
        "grpo": (), "cold": (), "hot": (), "ead": ("ead",), "ase": ("ase",),
        "extra": ("extra",), "eden": ("eden",),
    }  # fmt: skip
    assert configs["eden"].exploration.eden.allow_unviable  # its check reports, not refuses
    assert {c.seed for c in configs.values()} == {3}
    assert {c.model.base for c in configs.values()} == {"configs/lab.py:sft,lab2"}
    assert study2.arm_config("ase_random", 0).exploration.ase.directions == "random"
    assert study2.arm_config("ase_shuffled", 0).exploration.ase.directions == "shuffled"
    with pytest.raises(SystemExit, match="are not kept"):
        study2.arm_config("ead_fixed", 0, str(tmp_path))
    for seed in study2.SEEDS:
        _kept(tmp_path, "ead", seed, 0.5)  # its rollouts at 0.9 every step
    fixed = study2.arm_config("ead_fixed", 2, str(tmp_path))
    assert (fixed.rollout.temperature, tuple(fixed.exploration.methods)) == (0.9, ())
    flat = study2.arm_config("ead_flat", 2, str(tmp_path))  # EAD's level, step by step
    assert flat.exploration.ead.levels == (0.9,) * STEPS
    assert tuple(flat.exploration.methods) == ("ead",) and flat.rl.tis_cap == 2.0
    assert flat.exploration.ead.to_dict() == {
        **configs["ead"].exploration.ead,
        "levels": (0.9,) * STEPS,
    }


def test_ead_flat_takes_eads_level_step_by_step(tmp_path):
    """ead_flat's level at step s: the mean over EAD's seeds of what each drew at step s."""
    for seed in study2.SEEDS:
        _kept(tmp_path, "ead", seed, 0.5)
        rows = [{**r, "rollout/temperature": 0.1 * r["step"] / STEPS + 0.01 * (seed % 2)}
                for r in _rows("ead", True)]  # fmt: skip
        with open(tmp_path / f"ead-s{seed}" / "metrics.jsonl.gz", "wb") as f:
            f.write(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows)))
    levels = study2.ead_levels(str(tmp_path))
    assert len(levels) == STEPS and levels[0] == round(0.1 / STEPS + 0.005, 3)
    assert levels[STEPS - 1] == 0.105 and levels[29] == 0.055  # steps 60 and 30
    assert study2.ead_level(str(tmp_path)) == 0.06  # (0.1 x 61 / 120 + 0.005) = 0.0558
    rows = [r for r in _rows("ead", True) if r["step"] != 7]  # a seed missing a step
    with open(tmp_path / "ead-s3" / "metrics.jsonl.gz", "wb") as f:
        f.write(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows)))
    with pytest.raises(SystemExit, match="did not log a temperature at every step"):
        study2.ead_levels(str(tmp_path))


@pytest.mark.parametrize("ead_passed", [True, False])
def test_the_focused_tables_decompose_eads_difference(tmp_path, ead_passed):
    """The focused section gives each levelled arm's setting, ead_flat's level beside EAD's,
    then EAD minus each control and ead_flat minus ead_fixed; a verdict involving EAD
    carries the caveat when EAD's own checks failed."""
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    os.makedirs(runs)
    for seed in range(3):
        _kept(kept, "ead", seed, 0.55 + 0.001 * seed, good=ead_passed)
        _kept(kept, "ead_flat", seed, 0.5)
        _kept(kept, "ead_fixed", seed, 0.55 - 0.001 * (seed % 2), trained=0.9)
    text = study2.report(str(runs), str(kept), str(tmp_path), str(tmp_path / "figures"))
    focused = text.split("\n## Focused experiments")[1]
    assert "ead_fixed: configs/grpo.py:lab2 with rollout.temperature = 0.9 (" in focused
    assert ("ead_flat: configs/ead.py:lab2 with exploration.ead.levels = a level a step for 60 "
            "steps (step 1 0.9, step 30 0.9, step 60 0.9; mean 0.900) (") in focused  # fmt: skip
    assert "| realised level: mean token temperature, every step | ead_flat | 0.900 [" in focused
    assert "| beside it: EAD's | ead | 0.900 [" in focused
    assert "the last's (EAD's above) | ead_flat | 0.000 [0.000, 0.000] | (reported) |" in focused
    assert "KL(mu, pi_old) a token | ead_flat | 0.020 [0.020, 0.020] | (reported) |" in focused
    assert focused.index("ead_flat's checks:") < focused.index("| ead - ead_fixed | 3 |")

    def row(label):
        return next(x for x in focused.splitlines() if x.startswith(f"| {label} | 3 |"))

    caveat = "" if ead_passed else study2.CAVEAT
    assert row("ead - ead_flat").endswith(f"| better{caveat} |")  # 0.05, 0.051, 0.052
    assert row("ead - ead_fixed").endswith(f"| no difference of 0.02 or more{caveat} |")
    assert row("ead_flat - ead_fixed").endswith("| worse |")  # no EAD: no caveat


def test_the_report_puts_each_methods_checks_before_its_primary_endpoint(tmp_path):
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    os.makedirs(runs)
    for seed in range(3):
        base = 0.5 + 0.05 * seed
        _kept(kept, "grpo", seed, base)
        _kept(kept, "ead", seed, base + 0.03 + 0.001 * seed)  # better, checks pass
        _kept(kept, "ase", seed, base + 0.03 + 0.001 * seed, good=False)  # checks fail
        _kept(kept, "cold", seed, base - 0.001 * (seed % 2), trained=0.7)  # no difference
    text = study2.report(str(runs), str(kept), str(tmp_path), str(tmp_path / "figures"))
    assert text == (tmp_path / "study2.md").read_text()
    assert "**A pilot, not the study**" in text
    assert "Seeds finished: grpo 3 (0,1,2); cold 3 (0,1,2); ead 3 (0,1,2); ase 3" in text
    sections = text.split("\n## ")
    ead = next(s for s in sections if s.startswith("ead "))
    assert ead.index("### Mechanism checks") < ead.index("### Primary endpoint")
    assert "| realised profile: first token's temperature minus the last's" in ead
    assert "| ead | 0.150 [0.150, 0.150] | >= 0.1 | passed |" in ead
    primary = [line for line in ead.splitlines() if line.startswith("| ead | 3 |")]
    assert primary and primary[0].endswith("| better |")
    ase = next(s for s in sections if s.startswith("ase "))
    assert ase.index("### Mechanism checks") < ase.index("### Primary endpoint")
    assert "| better (mechanism check failed: measures the lab, not the method) |" in ase
    cold = next(s for s in sections if s.startswith("cold "))
    assert "A control: no mechanism checks." in cold
    assert "| a control: no prediction |" in cold and "| no difference" not in cold
    # sampled at its own training temperature (its sweep's "rollout": 0.1 x 0.7, 0.5 x 0.7)
    assert "### At its own training temperature (T 0.7), beside grpo at T 1" in cold
    assert "| cold | 0.7 | 3 | 0.070 [0.070, 0.070] | 0.350 [0.350, 0.350] |" in cold
    assert "| grpo | 1 | 3 | 0.100 [0.100, 0.100] | 0.500 [0.500, 0.500] |" in cold
    assert "At its own training temperature" not in ead
    # secondaries: 4 + solutions@64, distinct-4 of the first 4 correct + 2 temperatures x 2
    assert "each of its 10 secondaries at a Bonferroni-adjusted 0.9950 interval" in ead
    assert "| distinct solution trees a problem, all 64 | 3 |" in ead
    assert "| Pass@16 at T 0.6 | 3 |" in ead
    assert "| MiniLM LogDet" not in ead  # the variable-count measure: not a secondary
    assert "frontier.png" in os.listdir(tmp_path / "figures")


@pytest.mark.slow
def test_the_runner_end_to_end_at_smoke_size(tmp_path, monkeypatch):
    """Two arms x one seed through `run` with the configs made quick, each kept with both
    evaluations; a rerun trains nothing; `--report` writes the checks before the primary."""
    from configs.lab import smoke
    from explore_rl.train import base_model, loop

    resolve = base_model.resolve
    monkeypatch.setattr(base_model, "resolve", lambda c: resolve(smoke(c)))
    first, sweep = study2.EVALUATIONS
    quick = (
        study2.lab_study.Evaluation(samples=4, prompts=4),  # diversity: m = 4 correct
        study2.lab_study.Evaluation(
            sweep.name, samples=2, diversity=False, temperatures=("0.6", "rollout"), prompts=4
        ),
    )
    monkeypatch.setattr(study2, "EVALUATIONS", quick)
    runs, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    study2.run(runs, kept, ["ead", "grpo"], [0])
    for arm in ("grpo", "ead"):
        assert sorted(os.listdir(os.path.join(kept, f"{arm}-s0"))) == [
            "config.json", "eval.json", "eval_sweep.json", "machine.json",
            "metrics.jsonl.gz", "responses.json",
        ]  # fmt: skip
        with open(os.path.join(kept, f"{arm}-s0", "eval_sweep.json")) as f:
            swept = json.load(f)
        assert "eval/average/T_0.6/pass@1" in swept and "eval/average/pass@2" in swept
        assert not any("T_rollout" in k for k in swept)  # both trained at temperature 1
    monkeypatch.setattr(loop, "train", lambda *a: pytest.fail("a kept run trained again"))
    study2.run(runs, kept, ["ead", "grpo"], [0])
    out = tmp_path / "out"
    study2.main(["--report", "--runs", runs, "--kept", kept, "--out", str(out),
                 "--figures", str(tmp_path / "figures")])  # fmt: skip
    text = (out / "study2.md").read_text()
    ead = text.split("\n## ead ")[1]
    assert ead.index("### Mechanism checks") < ead.index("### Primary endpoint")
    assert "Seeds finished: grpo 1 (0); ead 1 (0)" in text


def test_the_pilots_the_preregistration_quotes_are_the_pilots_report():
    """docs/lab.md's study-2 section quotes its pilots' numbers from
    results/lab/pilot_lab2.md (each pilot's only output a setting): none typed by hand."""
    import re

    with open(os.path.join(HERE, "..", "docs", "lab.md")) as f:
        section = f.read().split("## Study 2, pre-registered", 1)[1]
    pilots = section.split("**Pilots, each with one output**", 1)[1].split("\n\n", 1)[0]
    with open(os.path.join(HERE, "..", "results", "lab", "pilot_lab2.md")) as f:
        report = f.read()
    number = re.compile(r"-?\d+\.\d+")
    quoted = set(number.findall(pilots))
    assert quoted and quoted <= set(number.findall(report)), quoted - set(number.findall(report))


def test_the_numbers_docs_quote_are_the_reports():
    """docs/lab.md's account of study 2 so far quotes results/lab/study2.md, which the
    script writes from the kept runs: every table row it shows is a row of the report and
    every decimal number one of its numbers, so none is typed by hand or left behind."""
    import re

    with open(os.path.join(HERE, "..", "docs", "lab.md")) as f:
        section = f.read().split("## Study 2 so far", 1)[1].split("\n## ", 1)[0]
    with open(os.path.join(HERE, "..", "results", "lab", "study2.md")) as f:
        report = f.read()
    rows = [line for line in section.splitlines() if line.startswith(("| ", "Seeds finished"))]
    assert rows and set(rows) <= set(report.splitlines()), set(rows) - set(report.splitlines())
    number = re.compile(r"-?\d+\.\d+")
    quoted = set(number.findall(section))
    assert quoted and quoted <= set(number.findall(report)), quoted - set(number.findall(report))

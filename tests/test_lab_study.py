"""results/lab/lab_study.py's report on synthetic run folders: every number from the runs,
each prediction judged by its paired interval, a partial study labelled a pilot."""

import importlib.util
import json
import math
import os
import sys

import numpy as np
import pytest

from explore_rl import analysis

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "lab_study", os.path.join(HERE, "..", "results", "lab", "lab_study.py")
)
study = importlib.util.module_from_spec(spec)
sys.modules["lab_study"] = study  # its dataclasses look their module up
spec.loader.exec_module(study)

EAD = {"tau_max": 1.2, "tau_min": 0.1, "d0": 3.75, "c": 1, "first_token": 1,
       "convention": "paper", "k": 0.0694, "at_eval": False}  # fmt: skip
QUESTIONS = ("9 11 14 -> 27", "7 2 7 -> 14")  # no division-free chain reaches the second


def _run(root, arm, seed, pass64, worst8, responses, tis=None):
    path = root / f"{arm}-s{seed}"
    os.makedirs(path)
    config = {"seed": seed, "train": {"steps": 300}, "rollout": {"max_new_tokens": 64}}
    rows = [{"step": s, "reward/mean": 0.2, "groups/zero_adv_frac": 0.4,
             "rollout/entropy": 0.5, "rollout/answer_disagreement": 0.3}
            for s in range(1, 301)]  # fmt: skip
    if arm == "ead":  # drawn at 0.1 over its first 10 steps, at 1 after
        config["exploration"] = {"methods": ["ead"], "ead": EAD}
        for r in rows:
            r["tis/mean"] = tis
            r["rollout/temperature"] = 0.1 if r["step"] <= 10 else 1.0
    if arm == "ase":  # the bank's first update at step 3: steering from step 4, 6 rows of 8
        config["exploration"] = {"methods": ["ase"], "ase": {"k": 3, "routing": "bank"}}
        config["rollout"]["group_size"] = 8
        for r in rows:  # its answers spread from step 150 on: +0.2 over GRPO's
            r["rollout/answer_disagreement"] += 0.2 * (r["step"] > 150)
            r["ase/updates"] = int(r["step"] >= 3)
            r["policy/kl_mu_old"] = 0.0 if r["step"] <= 3 else 0.0075
    if arm == "eden":  # its screen: 1 of 3 candidates within 0.1 of the clean accuracy
        config["exploration"] = {"methods": ["eden"]}
        for r in rows:
            r["eden/reward_clean"], r["eden/reward_noisy"] = 0.25, 0.01
        bank = {
            "clean_accuracy": 0.5,
            "tolerance": 0.1,
            "candidates": [
                {"id": i, "token": t, "accuracy": a}
                for i, t, a in ((3, "a", 0.45), (4, "b", 0.0), (5, "c", 0.3))
            ],
        }
        (path / "eden_bank.json").write_text(json.dumps(bank))  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = {"step": 300, "sampling": {"samples": 64}, "eval/average/pass@1": 0.2,
             "eval/average/pass@8": 0.5, "eval/average/pass@64": pass64,
             "eval/average/worst@8": worst8}  # fmt: skip
    (path / "eval.json").write_text(json.dumps(final))
    lines = [{"question": q, "response": r, "extracted": None, "correct": ok}
             for q, r, ok in responses]  # fmt: skip
    (path / "eval_responses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_report_judges_each_prediction_from_the_runs(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    chain, other = QUESTIONS
    for seed in range(3):
        base = 0.6 + 0.1 * seed  # seeds differ more than the arms do: pairing resolves it
        _run(runs, "grpo", seed, base, 0.10,
             [(chain, "a", True), (chain, "a ", True), (other, "x", False)])  # fmt: skip
        _run(runs, "ead", seed, base + 0.02, 0.10 - 0.05 - 0.01 * seed,
             [(chain, "a", True), (chain, "b", True), (other, "y", True)], tis=1.01)  # fmt: skip
        _run(runs, "ase", seed, base, 0.10, [(chain, "a", True)])
        _run(runs, "eden", seed, base - 0.3, 0.10, [(chain, "a", True)])
        _run(runs, "ase_unstructured", seed, base - 0.01, 0.10, [(chain, "a", True)])
    os.makedirs(runs / "cold-s0")  # unfinished: no eval.json, not counted
    _run(runs, "hot", 0, 0.9, 0.5, [(chain, "a", True)])  # an evaluation of step 150 of 300
    final = json.loads((runs / "hot-s0" / "eval.json").read_text())
    (runs / "hot-s0" / "eval.json").write_text(json.dumps({**final, "step": 150}))
    _run(runs, "clip_higher", 0, 0.9, 0.5, [(chain, "a", True)])  # 8 samples, not the 64
    final = json.loads((runs / "clip_higher-s0" / "eval.json").read_text())
    (runs / "clip_higher-s0" / "eval.json").write_text(
        json.dumps({**final, "sampling": {"samples": 8}})
    )
    (runs / "hot-s1").mkdir()
    (runs / "hot-s1" / "eval.json").write_text('{"step": 3')  # half written: not counted
    kept = tmp_path / "kept"
    text = study.report(str(runs), str(kept), str(tmp_path), str(tmp_path / "figures"))
    assert text == (tmp_path / "study.md").read_text()
    # every evaluated run kept (the 3 arms' seeds), the others not; on a machine without
    # runs/ the kept runs alone give the same report
    assert sorted(os.listdir(kept)) == sorted(
        f"{a}-s{s}" for a in ("ase", "ase_unstructured", "ead", "eden", "grpo") for s in range(3)
    )
    os.rename(runs, tmp_path / "elsewhere")
    assert study.report(str(runs), str(kept), str(tmp_path), str(tmp_path / "figures")) == text
    os.rename(tmp_path / "elsewhere", runs)
    kind = "AVX-512" if study.machine()["avx512"] else "no AVX-512"  # this machine's
    # kept by the report, not by the process that ran them: which commit ran them is unknown
    assert f"({kind}), commit not recorded: ase-s0, ase-s1, ase-s2, ase_unstructured-s0," in text
    # fewer seeds than the study's 8: intervals shown, nothing judged
    assert (
        "| EAD | Pass@64 above GRPO's | ead | 0.020 [0.020, 0.020] | 3 of 3 | not judged (3 of 8"
        in text
    )
    monkeypatch.setattr(study, "SEEDS", (0, 1, 2))  # as if the study had 3 seeds an arm
    text = study.report(str(runs), str(kept), str(tmp_path), str(tmp_path / "figures"))
    assert "**A pilot, not the study**" in text  # 3 seeds of 2 arms
    assert (
        "Seeds finished: ase 3 (0,1,2); ase_unstructured 3 (0,1,2); ead 3 (0,1,2); eden 3" in text
    )
    # ASE against its ablation, paired by seed: Pass@64 0.01 above on every seed
    assert (
        "| ase - ase_unstructured | 3 | 0.000 [0.000, 0.000] | 0.000 [0.000, 0.000] | "
        "0.010 [0.010, 0.010] |" in text
    )
    # EDEN's screen, kept with its runs; its noisy rows' reward against its clean rows'
    assert (
        "- eden: EDEN's anchor screen (each candidate appended to its probe's prompts "
        "without noise), on all 3 seeds: 1 of 3 candidates viable (clean accuracy 0.500, "
        "the best candidate's 0.450)" in text
    )
    eden = study.values(analysis.load_run(str(kept / "eden-s0")))
    assert (eden["clean_reward"], eden["noisy_reward"]) == pytest.approx((0.25, 0.01))
    verdicts = {
        line.split(" | ")[1]: line.split(" | ")[-1].rstrip(" |")
        for line in text.splitlines()
        if line.startswith(("| EAD |", "| ASE |"))
    }
    assert verdicts["Pass@64 above GRPO's"] == "held"  # +0.02 on every seed
    # the ablation's rollout metrics here are GRPO's, step for step; ASE's disagreement and
    # EAD's temperature are not
    assert "- ase_unstructured: its rollouts equal grpo's at every step" in text
    assert "- ase: its" not in text and "- ead: its" not in text
    assert verdicts["Pass@64 above temperature 0.7's"] == "not measured"  # no cold run
    assert verdicts["Worst@8 not below GRPO's (above -0.01)"] == "against"  # -0.05..-0.07
    assert (
        "| Worst@8 not below GRPO's (above -0.01) | ead | -0.060 [-0.070, -0.050] | 0 of 3 |"
        in text
    )
    # held, as a mean importance weight near 1 holds whatever the method does: said so
    assert verdicts["mean TIS weight within 0.05 of 1"].startswith("held, but no test: ")
    # EAD's temperature as its rollouts drew it, not as its schedule reads
    assert (
        "| ead | EAD: the same over steps 1-10 | 0.100 [0.100, 0.100] |" in text
        and "| ead | EAD: its rollouts' mean token temperature, every step (GRPO's: 1) | "
        "0.970 [0.970, 0.970] |"
        in text
    )
    # Pass@64 0.02 above GRPO on each of 3 seeds: no spread, two seeds detect it
    assert "| ead | 3 | 0.0000 | 0.000 | 2 | 2 |" in text
    # KL a steered token: 0.0075 over all rows once steering began, over 6 of 8 rows: 0.01
    ase = study.values(analysis.load_run(str(kept / "ase-s0")))
    assert ase["steered_kl"] == pytest.approx(0.01)
    assert verdicts["answer disagreement above GRPO's (the last 50 steps)"] == "held"
    assert ase["disagreement_growth"] == pytest.approx(0.2)
    assert verdicts["Mean@8 at least GRPO's (above -0.01; of 64 samples, as Pass@1)"] == "held"
    # the lab's EAD schedule: the first token at 0.1 at step 1, hot (1.19) by step 300
    ead = study.values(analysis.load_run(str(kept / "ead-s0")))
    assert ead["tau_first_start"] == pytest.approx(0.1)
    hot = 1.0 + 1.2 - math.exp(1 / (0.0694 * (3.75 + 5 * 300)))  # t = 1 at step s = 300
    assert ead["tau_first_end"] == pytest.approx(hot, rel=1e-5) and hot > 1.18
    # distinct correct responses a problem: "a" twice (one stripped) / 2 problems; the
    # problem without a chain solution solved by EAD only
    assert ead["distinct"] == pytest.approx(3 / 2) and ead["other@64"] == 1.0
    grpo = study.values(analysis.load_run(str(kept / "grpo-s0")))
    assert grpo["distinct"] == pytest.approx(1 / 2) and grpo["other@64"] == 0.0
    figures = ["curves.png", "ead.png", "eden.png", "pass_at_k.png"]
    assert sorted(os.listdir(tmp_path / "figures")) == figures


def test_a_margin_held_below_grpo_is_said_to_be_below():
    """ "At least GRPO's (above -0.01)" holds on an interval inside (-0.01, 0), and the
    report says the arm is below GRPO rather than letting "held" read as "as good"."""
    p = study.Prediction("ASE", "Mean@8 at least GRPO's", "ase", "pass@1", threshold=-0.01)
    grpo = {s: {"pass@1": 0.2} for s in range(8)}
    below = {s: {"pass@1": 0.2 - 0.005 - 0.001 * (s % 2)} for s in range(8)}
    level = {s: {"pass@1": 0.2 + 0.002 * (s % 2 - 0.5)} for s in range(8)}
    _, seeds, verdict = study.judge(p, {"grpo": grpo, "ase": below})
    assert (seeds, verdict) == (
        "8 of 8",
        "held on the margin, but below GRPO (the interval excludes 0)",
    )
    assert study.judge(p, {"grpo": grpo, "ase": level})[2] == "held"


ROOT = os.path.join(HERE, "..")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".git")), reason="git's ignore rules")
def test_the_kept_runs_are_not_ignored_by_git():
    """The kept runs exist to be committed: a `runs/` rule that matched any folder of that
    name ignored results/lab/runs, and two machines' kept runs were lost with it."""
    import subprocess

    def ignored(path):
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    assert not ignored(os.path.join(study.KEPT, "grpo-s0", "eval.json"))
    assert ignored("runs/demo/metrics.jsonl")  # the users' runs stay out


FOUND = "## What the study found"  # docs/lab.md's results: the last section
PREFIX_CHOICE = "### ExTra's prefix choice without RL"


def test_the_numbers_docs_quote_are_the_reports():
    """docs/lab.md's results quote results/lab/study.md, which the script writes from the
    runs: every table row they show is a row of the report and every decimal number one of
    its numbers, so none is typed by hand or left behind when the report changes."""
    import re

    with open(os.path.join(ROOT, "docs", "lab.md")) as f:
        found = f.read().split(FOUND, 1)[1]
    with open(os.path.join(ROOT, "results", "lab", "study.md")) as f:
        report = f.read()
    rows = [line for line in found.splitlines() if line.startswith("| ")]
    assert rows and set(rows) <= set(report.splitlines()), set(rows) - set(report.splitlines())
    number = re.compile(r"-?\d+\.\d+")
    quoted = set(number.findall(found))
    assert quoted and quoted <= set(number.findall(report)), quoted - set(number.findall(report))
    # a focused experiment's result quotes its own report
    with open(os.path.join(ROOT, "docs", "lab.md")) as f:
        prefix = f.read().split(PREFIX_CHOICE, 1)[1].split("\n#", 1)[0]
    with open(os.path.join(ROOT, "results", "lab", "prefix_choice.md")) as f:
        numbers = set(number.findall(f.read()))
    assert set(number.findall(prefix)) <= numbers, set(number.findall(prefix)) - numbers


choice_spec = importlib.util.spec_from_file_location(
    "prefix_choice", os.path.join(HERE, "..", "results", "lab", "prefix_choice.py")
)
choice = importlib.util.module_from_spec(choice_spec)
sys.modules["prefix_choice"] = choice
choice_spec.loader.exec_module(choice)


class _Chars:
    """A tokenizer of one character a token id (id 0: a line end)."""

    @staticmethod
    def decode(ids):
        return "".join("\n" if i == 0 else chr(ord("a") + i) for i in ids)


class _OneHot:
    """Embeddings far apart (no smoothing between candidates): one axis a text."""

    @staticmethod
    def embed(texts):
        return np.eye(len(texts), dtype=np.float32)


def test_the_prefix_experiment_mines_every_response_and_scores_its_choice():
    """A hard problem's candidates are the distinct cuts of all G responses with their mean
    token entropy; ExTra's choice is the lowest, and the report pairs its solve rate with
    the mean over candidates and with fresh rollouts, problem by problem."""
    g, t = choice.G, 12
    tokens = np.ones((g, t), np.int64)
    tokens[:, [4, 9]] = 0  # line ends at 4 and 9: one cut (at 4) a response, the last dropped
    tokens[1, :4] = 2  # response 1 starts otherwise: a second distinct prefix
    entropy = np.full((g, t), 0.5, np.float32)
    entropy[1, :5] = 0.1  # ... with the lower mean token entropy
    first = choice._Drawn(
        correct=np.zeros((1, g), bool),
        tokens=list(tokens),
        mask=list(np.ones((g, t), bool)),
        entropy=list(entropy),
    )
    cuts = choice._candidates(first, 0, _Chars(), min_gap=4, max_cuts=15)
    assert [(c.tokens, c.response) for c in cuts] == [((1, 1, 1, 1, 0), 0), ((2, 2, 2, 2, 0), 1)]
    assert [c.mte for c in cuts] == pytest.approx([0.5, 0.1])
    rate = {(0, cuts[0].tokens): 0.25, (0, cuts[1].tokens): 0.75, (0, ()): 0.125}
    text = choice._report([object()], first, [0], [cuts], rate, _OneHot(), _Chars(), tau=0.1)
    # chosen 0.75, the mean cut 0.5, fresh 0.125: +0.25 and +0.625 on the one problem
    assert "| **primary**: ExTra's choice minus a random cut | 1 | 0.250 [0.250, 0.250] |" in text
    assert "| ExTra's choice minus fresh unguided rollouts | 1 | 0.625 [0.625, 0.625] |" in text
    # the public code mines the lowest-entropy response only: response 1, the same choice
    assert "lowest-MTE rollout mined) minus a random cut | 1 | 0.250 [0.250, 0.250] |" in text


# Settings added to the methods after study 1 ran, with the behaviour study 1 ran with: its
# arms must name these (their kept config.json files predate the settings)
STUDY1_RULES = {
    "exploration.extra.mine": "lowest",
    "exploration.eden.allow_unviable": True,
    "exploration.eden.bank_seed": 0,
}


def test_study_1s_arms_are_the_runs_it_kept(monkeypatch):
    """Every arm of study 1 resolves to the config its kept seed-0 run recorded (each setting
    a resume compares), and names the study's rule for each setting added since, so a rerun
    of study 1 runs what it ran."""
    from explore_rl.logs import flatten
    from explore_rl.spec import SCHEDULING
    from explore_rl.train import base_model, build

    # the base model's folder without training it (the kept runs name their machine's)
    monkeypatch.setattr(base_model, "resolve", lambda c: c.copy_and_resolve_references())
    for arm in study.ARMS:
        c = study.arm_config(arm, 0)
        now = flatten(json.loads(json.dumps(c.to_dict(), default=list)))
        for key, rule in STUDY1_RULES.items():
            if key.rsplit(".", 1)[0] in {f"exploration.{m}" for m in c.exploration.methods}:
                assert now[key] == rule, (arm, key)
        kept = os.path.join(ROOT, study.KEPT, f"{arm}-s0", "config.json")
        if not os.path.exists(kept):  # a pilot's arm: not kept
            continue
        with open(kept) as f:
            before = flatten(json.load(f))
        compared = [
            k
            for k in before.keys() & now.keys()
            if k.startswith(build._SAME_RUN)
            and k not in SCHEDULING
            and k not in ("model.path", "model.random_init")
        ]
        assert len(compared) > 50
        assert {k: now[k] for k in compared} == {k: before[k] for k in compared}, arm

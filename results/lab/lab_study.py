"""The lab study: every arm x 8 seeds x 300 steps from one base model, each run's final
held-out evaluation, and the report against the predictions in docs/lab.md.

    python results/lab/lab_study.py                        # every run, then the report
    python results/lab/lab_study.py --seeds 0 1 --arms grpo ead  # a part of it
    python results/lab/lab_study.py --report               # the report of the runs there are
    python results/lab/lab_study.py --pilot extra          # the pilots docs/lab.md names
    python results/lab/lab_study.py --pilot ase

Runs go seed by seed (every arm's seed 0, then every arm's seed 1, ...), so a study stopped
part way has paired comparisons for the seeds it finished; each run resumes where it
stopped and a finished one is read, as is a finished final evaluation. What the report
reads of a finished run (its config, metrics, final evaluation and its responses' counts) is
kept in `results/lab/runs/<arm>-s<seed>/`, committed: a new machine has no runs/, and the
study goes on from the runs kept there. A run's final
evaluation is `--mode eval` of its last checkpoint in its own folder (eval.json): the 512
test problems x 64 samples at temperature 1, the same for every arm. Every number in the
report (`<out>/study.md`) and the pilots' (`<out>/pilot_<name>.md`) comes from the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import os
import shutil

import numpy as np

SEEDS = tuple(range(8))
FINAL_SAMPLES = 64
FIGURES = "results/lab/figures"
KEPT = "results/lab/runs"
FOUR = {"task.name": "countdown", "task.countdown.inputs": 4}  # drawn in code, not data/
# study 1's ExTra-R mined only a hard group's lowest-entropy rollout (then the only rule;
# the default since is the paper's every rollout): its arms keep the rule they ran with
LOWEST = {"exploration.extra.mine": "lowest"}
# study 1's EDEN screen found no viable anchor (docs/lab.md) and topped its bank up with the
# most accurate others, as the screen then did (it refuses that since unless allowed), and
# drew its candidates with seed 0 whatever the run's (the default since is the run's); its
# probe's rollout keys are folded from that seed since, so a fresh screen of these arms
# draws other probe rollouts than the kept runs did (a resumed run restores its bank)
EDEN1 = {"exploration.eden.allow_unviable": True, "exploration.eden.bank_seed": 0}

# arm -> (config, overrides): the arms of docs/lab.md, each the lab's GRPO setting with one
# thing changed (the same base model, rollout budget and evaluation)
ARMS = {
    "grpo": ("configs/grpo.py:lab", {}),
    "cold": ("configs/grpo.py:lab", {"rollout.temperature": 0.7}),
    "hot": ("configs/controls.py:temperature,lab", {}),
    "clip_higher": ("configs/controls.py:clip_higher,lab", {}),
    "ead": ("configs/ead.py:lab", {}),
    "eden": ("configs/eden.py:lab", EDEN1),
    "eden_ead": ("configs/eden.py:lab", {**EDEN1, "+ead": "configs/ead.py:lab"}),
    "ase": ("configs/ase.py:lab", {}),
    "ase_unstructured": ("configs/ase.py:unstructured,lab", {}),
    # ExTra-R cuts a response at its line ends but the last: a 3-number answer (2 lines)
    # has none, so ExTra's arms and their own GRPO run on 4 numbers (3 lines; its own base
    # model: the recipe takes the run's task), as docs/lab.md's rule says when the pilot
    # (`--pilot extra`) finds less than one guided group a step
    "grpo4": ("configs/grpo.py:lab", FOUR),
    "extra_n4": ("configs/extra.py:novelty,lab", {**FOUR, **LOWEST}),
    "extra_r4": ("configs/extra.py:regen,lab", {**FOUR, **LOWEST}),
    "extra4": ("configs/extra.py:lab", {**FOUR, **LOWEST}),
    "extra_r": ("configs/extra.py:regen,lab", LOWEST),  # the pilot's only
    # a follow-up, written in docs/lab.md before it ran: EDEN with EAD's TIS cap and nothing
    # else changed, whether EDEN's collapse is its noisy rows entering the update uncorrected
    "eden_tis": ("configs/eden.py:lab", {**EDEN1, "rl.tis_cap": 2.0}),
}
FOLLOW_UPS = ["eden_tis"]
PREREGISTERED = [a for a in ARMS if a not in ("extra_r", *FOLLOW_UPS)]
STUDY = PREREGISTERED + FOLLOW_UPS
BASELINE = {a: "grpo4" if a.endswith("4") else "grpo" for a in ARMS}


def arm_config(arm: str, seed: int, arms: dict | None = None):
    """The arm's config at `seed`, its base model resolved; `arms`: {arm: (config,
    overrides)} (default ARMS: this study's). "+ead" composes EAD (its lab schedule and TIS
    cap) after the arm's own method, as configs/eden.py's test does."""
    from explore_rl import config as config_lib
    from explore_rl.train import base_model

    path, overrides = (arms or ARMS)[arm]
    c = config_lib.load(path)
    for key, value in overrides.items():
        if key == "+ead":
            ead = config_lib.load(value)
            c.exploration.methods = (*c.exploration.methods, "ead")
            c.exploration.ead, c.rl.tis_cap = ead.exploration.ead, ead.rl.tis_cap
            continue
        *sections, field = key.split(".")
        node = c
        for section in sections:
            node = node[section]
        node[field] = value
    c.seed = seed
    return base_model.resolve(c)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A final evaluation of a run's last checkpoint, `run_eval` in the run's folder as
    `<name>.json`: the test problems (`prompts`: the first that many, 0 every one) x
    `samples` at the config's eval.temperature, with the diversity measures where
    `diversity`, and at each of `temperatures` (`eval.temperatures`; "rollout", the run's
    own training temperature, only where that is neither 1 nor another of them)."""

    name: str = "eval"
    samples: int = FINAL_SAMPLES
    diversity: bool = True  # distinct-4, Self-BLEU, MiniLM LogDet, the solutions' trees
    temperatures: tuple[str, ...] = ()
    prompts: int = 0
    correct: int = 4  # the diversity measures' "first m correct" (`eval.diversity_correct`)

    def config(self, c, path: str):
        """Run config `c` made this evaluation of the checkpoints in `path`."""
        e = c.copy_and_resolve_references()
        e.eval.checkpoint, e.eval.samples, e.eval.num_prompts = path, self.samples, self.prompts
        e.eval.diversity, e.eval.diversity_correct = self.diversity, self.correct
        # "rollout" only where it adds a temperature: at 1 (or one swept) it repeats one
        swept = {float(t) for t in self.temperatures if t != "rollout"} | {1.0}
        own = c.rollout.temperature not in swept
        e.eval.temperatures = ",".join(t for t in self.temperatures if t != "rollout" or own)
        return e

    def done(self, path: str) -> bool:
        """The run in `path` has this evaluation: `<name>.json` (written last, renamed into
        place) of its last step with `samples` samples."""
        try:
            with open(os.path.join(path, f"{self.name}.json")) as f:
                done = json.load(f)
            with open(os.path.join(path, "config.json")) as f:
                steps = json.load(f)["train"]["steps"]
            return done["step"] == steps and done["sampling"]["samples"] == self.samples
        except (OSError, ValueError, KeyError):  # none, half a file, another kind of file
            return False


HELD_OUT = (Evaluation(),)  # study 1's: 512 x 64 at temperature 1, eval.json


def train_and_evaluate(c, path: str, evaluations: tuple[Evaluation, ...] = HELD_OUT) -> None:
    """The run in `path` (resumed, or read when finished), then each of its final
    `evaluations` not yet written."""
    from explore_rl import config as config_lib
    from explore_rl.modes.eval import run_eval
    from explore_rl.train import loop

    # a stop signal raises here: no evaluation of a part of a run
    loop.train(config_lib.spec(c), path)
    for e in evaluations:
        if not e.done(path):
            run_eval(config_lib.spec(e.config(c, path)), path, e.name)


def _evaluated(path: str, evaluations: tuple[Evaluation, ...] = HELD_OUT) -> bool:
    """The run in `path` has every one of its final `evaluations`."""
    return all(e.done(path) for e in evaluations)


def run_study(
    runs: str,
    kept: str,
    arms: list[str],
    seeds: list[int],
    config=None,
    evaluations: tuple[Evaluation, ...] = HELD_OUT,
) -> None:
    """Every arm's seed, seed by seed, in `runs/<arm>-s<seed>`, each kept in `kept` once it
    has its final `evaluations`; a run already kept is done. `config(arm, seed)`: the run's
    config (default `arm_config`: this study's arms)."""
    config = config or arm_config
    program = commit()  # now: this process runs the code it imported, whatever HEAD becomes
    for seed in seeds:
        for arm in arms:
            path, saved = (os.path.join(d, f"{arm}-s{seed}") for d in (runs, kept))
            if _evaluated(saved, evaluations):
                continue
            print(f"== {path}", flush=True)
            train_and_evaluate(config(arm, seed), path, evaluations)
            keep(path, saved, program, evaluations)


def keep(
    path: str, kept: str, program: str | None, evaluations: tuple[Evaluation, ...] = HELD_OUT
) -> None:
    """What the report reads of the evaluated run in `path`, into `kept`: config.json,
    each of its `evaluations` (eval.json), an EDEN run's eden_bank.json (its anchor
    screen), metrics.jsonl (gzip), responses.json (`_responses`: the 512 x 64 responses
    themselves are too big to commit) and machine.json (the CPU kind and `program`, the
    commit that ran it). Built beside and renamed into place."""
    tmp = kept + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in ("config.json", *(f"{e.name}.json" for e in evaluations)):
        shutil.copy(os.path.join(path, name), tmp)
    if os.path.exists(bank := os.path.join(path, "eden_bank.json")):
        shutil.copy(bank, tmp)
    with (
        open(os.path.join(path, "metrics.jsonl"), "rb") as f,
        gzip.open(os.path.join(tmp, "metrics.jsonl.gz"), "wb") as g,
    ):
        shutil.copyfileobj(f, g)
    with open(os.path.join(tmp, "responses.json"), "w") as f:
        json.dump(_responses(path), f)
    with open(os.path.join(tmp, "machine.json"), "w") as f:
        json.dump({**machine(), "commit": program}, f)
    shutil.rmtree(kept, ignore_errors=True)
    os.rename(tmp, kept)


def machine() -> dict:
    """The CPU kind this process runs on. XLA's CPU kernels differ with the vector width,
    so one seed's rollouts differ between kinds (GRPO seed 0's held-out Pass@64: 0.717 on
    an AVX-512 machine, 0.693 on an AVX2 one): the report says which kinds its runs had."""
    import platform

    model, avx512 = platform.processor(), False
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            info = f.read()
        names = [
            line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line
        ]
        model, avx512 = (names[0] if names else model), " avx512f" in info
    return {"cpu": model, "avx512": avx512, "cores": os.cpu_count()}


def commit() -> str | None:
    """The checkout's commit ("+" if its code or configs have changes), None outside git.
    Float rounding is the program's too: the update's 2-D MLP products (dd0a777) round
    differently, so the report says which commit ran each run; runs kept before it record
    none."""
    import subprocess

    def git(*args):
        return subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode:
        return None
    changed = git("status", "--porcelain", "--", ":/explore_rl", ":/configs").stdout.strip()
    return head.stdout.strip() + ("+" if changed else "")


def parser(doc: str, runs: str, kept: str, figures: str, arms: list, default: list):
    """A study's command line: where its runs go and are kept, its report and figures, the
    arms (of `arms`, `default` unless named) and seeds to run, or only the report."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--runs", default=runs)
    p.add_argument("--kept", default=kept, help="the finished runs' numbers (committed)")
    p.add_argument("--out", default="results/lab")
    p.add_argument("--figures", default=figures)
    p.add_argument("--arms", nargs="+", default=default, choices=arms)
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--report", action="store_true", help="only the report of the runs there are")
    return p


def main(argv=None) -> None:
    p = parser(__doc__, "runs/lab-study", KEPT, FIGURES, list(ARMS), STUDY)
    p.add_argument("--pilot", choices=("extra", "ase"), help="a pilot of docs/lab.md")
    args = p.parse_args(argv)

    from explore_rl import caching

    caching.enable_compilation_cache()
    os.makedirs(args.out, exist_ok=True)
    if args.pilot:
        text = PILOTS[args.pilot](os.path.join(args.runs, "pilot"))
        with open(os.path.join(args.out, f"pilot_{args.pilot}.md"), "w") as f:
            f.write(text + "\n")
        print(text)
        return
    if not args.report:
        run_study(args.runs, args.kept, args.arms, args.seeds)
    print(report(args.runs, args.kept, args.out, args.figures))


# ---------------------------------------------------------------------------------- pilots

EXTRA_PILOT_STEPS = 60  # the warm-up's 30 steps and 30 with regeneration


def pilot_extra(runs: str) -> str:
    """ExTra-R, seed 0, 60 steps: guided groups a step after the warm-up. docs/lab.md's rule:
    at 3 numbers below one a step, the ExTra arms move to 4 numbers (measured then too)."""
    lines = []
    for arm in ("extra_r", "extra_r4"):
        mean, text = _guided(arm, os.path.join(runs, f"{arm}-s0"))
        lines += [text, ""]
        if mean >= 1:
            break
    return "\n".join(lines).strip()


def _guided(arm: str, path: str) -> tuple[float, str]:
    from explore_rl import config as config_lib
    from explore_rl.logs import read_metrics
    from explore_rl.train import loop

    c = arm_config(arm, 0)
    c.train.steps, c.train.eval_every, c.train.eval_before = EXTRA_PILOT_STEPS, 0, False
    loop.train(config_lib.spec(c), path)
    rows = [r for r in read_metrics(path) if r["step"] > c.exploration.extra.warmup]
    guided = [r["extra/guided_rows"] / c.rollout.group_size for r in rows]
    hard = [r["extra/hard"] for r in rows]
    cut = [r for r in rows if "extra/mte_chosen" in r]
    mean = sum(guided) / len(guided)
    numbers = c.task.countdown.inputs if c.task.name == "countdown" else 3
    return mean, "\n".join([
        f"ExTra-R pilot at {numbers} numbers ({ARMS[arm][0]}, seed 0, steps {rows[0]['step']}-"
        f"{rows[-1]['step']}, after the {c.exploration.extra.warmup}-step warm-up):",
        f"- guided groups a step: mean {mean:.2f} (min {min(guided):.0f}, max {max(guided):.0f})",
        f"- hard groups a step (regeneration's candidates): mean {sum(hard) / len(hard):.2f}",
        f"- steps with at least one guided group: {sum(x >= 1 for x in guided)} of {len(rows)}",
        f"- steps that chose a prefix: {len(cut)} of {len(rows)}" + (
            f"; its mean token entropy {_mean(cut, 'extra/mte_chosen'):.3f} against a random "
            f"cut's {_mean(cut, 'extra/mte_random'):.3f}" if cut else ""),
        f"- the rule (docs/lab.md), at least one a step: "
        f"{'held' if mean >= 1 else 'not held'} at {numbers} numbers",
    ])  # fmt: skip


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


ASE_ALPHAS = (0.5, 1.0, 2.0, 4.0)
ASE_KL = 0.01


def pilot_ase(runs: str) -> str:
    """ASE alpha: the smallest of ASE_ALPHAS whose steered routes move the rollouts by at
    least ASE_KL nats a token over steps 10-30. Clean rows are drawn from pi_old itself (no
    steering: their KL(mu, pi_old) is 0), so a steered token's KL is the update's mean over
    all tokens divided by the steered routes' share of the rows (K of K + 1 routes)."""
    from explore_rl import config as config_lib
    from explore_rl.logs import read_metrics
    from explore_rl.train import loop

    lines = ["ASE alpha pilot (configs/ase.py:lab, seed 0, steps 10-30):", "",
             "| alpha | KL(mu, pi_old) a token, all rows | steered rows' share | "
             "a steered token | reward |", "|---|---|---|---|---|"]  # fmt: skip
    chosen = None
    for alpha in ASE_ALPHAS:
        c = arm_config("ase", 0)
        c.exploration.ase.alpha = alpha
        c.train.steps, c.train.eval_every, c.train.eval_before = 30, 0, False
        path = os.path.join(runs, f"ase-alpha{alpha:g}-s0")
        loop.train(config_lib.spec(c), path)
        rows = [r for r in read_metrics(path) if r["step"] >= 10]
        kl = sum(r["policy/kl_mu_old"] for r in rows) / len(rows)
        k, g = c.exploration.ase.k, c.rollout.group_size
        share = _steered_share(g, k)
        steered = kl / share
        reward = sum(r["reward/mean"] for r in rows) / len(rows)
        lines.append(f"| {alpha:g} | {kl:.4f} | {share:.2f} | {steered:.4f} | {reward:.3f} |")
        if steered >= ASE_KL:
            chosen = alpha
            break
    lines += ["", f"The rule (docs/lab.md): the smallest alpha with a steered token's KL >= "
              f"{ASE_KL}: " + (f"alpha = {chosen:g}" if chosen else "none of them")]  # fmt: skip
    return "\n".join(lines)


def _steered_share(g: int, k: int) -> float:
    from explore_rl.exploration.ase import routes

    r = routes(g, k)
    return float((r > 0).mean())


PILOTS = {"extra": pilot_extra, "ase": pilot_ase}


# ---------------------------------------------------------------------------------- report

WARMUP = 30  # EDEN's and ExTra's warm-up in the lab (docs/lab.md): "after the warm-up"
# (column, what it is): the per-run values `values` computes, in the report's order
FINAL = (
    ("pass@1", "Pass@1"),
    ("pass@8", "Pass@8"),
    ("pass@64", "Pass@64"),
    ("worst@8", "Worst@8"),
    ("distinct", "distinct correct responses a problem"),
    ("other@64", "Pass@64 on the problems without a chain solution"),
    ("distinct4", "distinct-4 of correct responses"),
    ("logdet", "LogDet of correct responses"),
)
TRAINING = (
    ("base_pass8", "the base model's Pass@8 (step 0, 8 samples)"),
    ("reward", "reward, every step"),
    ("zero_adv", f"zero-advantage groups after step {WARMUP}"),
    ("entropy", "token entropy, the last 50 steps"),
    ("disagreement", "answer disagreement, the last 50 steps"),
    ("clean_zero_adv", f"EDEN: zero-advantage groups of its 6 clean rows after step {WARMUP}"),
    ("clean_entropy", "EDEN: its clean rows' token entropy, the last 50 steps"),
    ("clean_reward", "EDEN: its clean rows' reward, every step"),
    ("noisy_reward", "EDEN: its noisy rows' reward, every step"),
)


# (arm, value, what it is): whether each mechanism had room to act, as its runs measured it
MECHANISMS = (
    ("ead", "temperature", "EAD: its rollouts' mean token temperature, every step (GRPO's: 1)"),
    ("ead", "temperature_first10", "EAD: the same over steps 1-10"),
    ("eden", "noisy_reward", "EDEN: its noisy rows' reward, every step (its anchors: the checks)"),
    ("extra4", "epochs", "ExTra: training problems drawn, in epochs of the pool (below 1 none "
     "recurs: no memory holds an earlier rollout of the problem at hand)"),
    ("extra_n4", "novelty_one", "ExTra-N: steps whose correct responses' mean novelty bonus is "
     "exactly 1 (nothing stored or beside them to differ from)"),
    ("extra4", "novelty_one", "ExTra: the same"),
    ("extra4", "guided_share", f"ExTra: guided rows' share of a step's rows after step {WARMUP} "
     "(the paper's: about 1/16)"),
    ("extra4", "one_choice", "ExTra: steps whose chosen prefix's entropy equals the random "
     "cut's (one cut to choose from)"),
    ("extra4", "guided_solve", "ExTra: guided rows' solve rate"),
    ("grpo4", "accuracy", f"GRPO at 4 numbers: its rows' solve rate after step {WARMUP}, in "
     "expectation above a fresh unguided rollout's of a hard problem"),
)  # fmt: skip
# the effects (Pass@64, paired) the power section plans seeds for
POWER_EFFECTS = (0.01, 0.02)


def values(run) -> dict[str, float]:
    """One run's numbers for the report: its final evaluation (eval.json and its responses)
    and its training metrics, each named as FINAL, TRAINING and PREDICTIONS use them."""
    m, out = run.metrics, {}
    for k in ("pass@1", "pass@8", "pass@64", "worst@8", "distinct4", "logdet"):
        out[k] = run.final.get(f"eval/average/{k}")
    with open(os.path.join(run.path, "responses.json")) as f:  # a kept run's
        out.update(json.load(f))

    def mean(key, after=0, last=None, first=None):
        if key not in m:
            return None
        series = m[key].dropna()
        series = series[series.index > after]
        series = series.tail(last) if last else series.head(first) if first else series
        return float(series.mean())

    if 0 in m.index and "eval/average/pass@8" in m:  # train.eval_before: the base model
        out["base_pass8"] = float(m.loc[0, "eval/average/pass@8"])
    out["reward"] = mean("reward/mean")
    out["zero_adv"] = mean("groups/zero_adv_frac", WARMUP)
    out["entropy"] = mean("rollout/entropy", last=50)
    # ASE paper, Fig. 4: pairwise disagreement of a problem's sampled answers, per run
    out["disagreement"] = mean("rollout/answer_disagreement", last=50)
    first = mean("rollout/answer_disagreement", first=50)
    out["disagreement_growth"] = None if first is None else out["disagreement"] - first
    out["clean_zero_adv"] = mean("eden/clean_zero_adv_frac", WARMUP)
    out["clean_entropy"] = mean("eden/clean_entropy", last=50)
    out["clean_reward"] = mean("eden/reward_clean")
    out["noisy_reward"] = mean("eden/reward_noisy")
    out["tis_gap"] = None if "tis/mean" not in m else abs(mean("tis/mean") - 1.0)
    if "exploration.ase.k" in run.config and "ase/updates" in m:
        out["steered_kl"] = _steered_kl(run, mean)
    # the rollouts' own mean token temperature, not a schedule's: EAD's as it sampled
    out["temperature"] = mean("rollout/temperature")
    out["temperature_first10"] = mean("rollout/temperature", first=10)
    out["accuracy"] = mean("reward/accuracy", WARMUP)
    c = run.config
    if "exploration.extra.warmup" in c:  # ExTra's room to act (docs/lab.md, study 1)
        # one seeded shuffle an epoch: below one epoch no training problem recurs, so no
        # memory holds an earlier rollout of the problem at hand
        out["epochs"] = (int(c["train.steps"]) * int(c["rollout.prompts"])
                         / int(c["task.train_size"]))  # fmt: skip
    if "extra/guided_rows" in m:
        g = int(c["rollout.group_size"])
        out["guided_groups"] = mean("extra/guided_rows", WARMUP) / g
        out["guided_share"] = out["guided_groups"] / int(c["rollout.prompts"])
        out["guided_solve"] = mean("extra/guided_solve_rate")
        if "extra/mte_chosen" in m:
            out["mte_gap"] = mean("extra/mte_chosen") - mean("extra/mte_random")
            cut = m[["extra/mte_chosen", "extra/mte_random"]].dropna()
            out["one_choice"] = float((cut["extra/mte_chosen"] == cut["extra/mte_random"]).mean())
    if "extra/novelty_mean" in m:  # exactly 1: no stored or sibling correct answer to differ from
        out["novelty_one"] = float((m["extra/novelty_mean"].dropna() == 1.0).mean())
    if "exploration.ead.d0" in run.config:
        out.update(_ead_schedule(run))
    return out


def _steered_kl(run, mean) -> float | None:
    """KL(mu, pi_old) per steered token, from the first step that steered: every row under
    unstructured routing, else the bank's routes from the step after its first update (a
    clean row's KL is 0: the all-row mean over the steered rows' share)."""
    c = run.config
    if c["exploration.ase.routing"] == "unstructured":
        return mean("policy/kl_mu_old")
    updated = run.metrics["ase/updates"].dropna()
    updated = updated[updated > 0]
    if updated.empty:
        return None
    share = _steered_share(int(c["rollout.group_size"]), int(c["exploration.ase.k"]))
    return mean("policy/kl_mu_old", int(updated.index[0])) / share


def _responses(path: str) -> dict[str, float]:
    """From eval_responses.jsonl: distinct correct responses a problem (the mean over
    problems) and Pass@n on the problems without a division-free chain solution (the
    strategy SFT never showed)."""
    file = os.path.join(path, "eval_responses.jsonl")
    if not os.path.exists(file):
        return {}
    correct: dict[str, set] = {}
    solved: dict[str, bool] = {}
    with open(file) as f:
        for line in f:
            r = json.loads(line)
            correct.setdefault(r["question"], set())
            if r["correct"]:
                correct[r["question"]].add(r["response"].strip())
    for q, answers in correct.items():
        if not _has_chain(q):
            solved[q] = bool(answers)
    return {
        "distinct": sum(map(len, correct.values())) / len(correct),
        "other@64": sum(solved.values()) / len(solved) if solved else None,
    }


@functools.cache
def _has_chain(question: str) -> bool:
    """A division-free chain solves it (a brute force: once a question, not once a run)."""
    from explore_rl.data import countdown

    return countdown.chain_solution(*countdown.parse_question(question)) is not None


def _ead_schedule(run) -> dict[str, float]:
    """EAD's temperature of the first response token as the run drew it (its schedule, from
    its config): at the first and last steps and the mean over steps."""
    from explore_rl.exploration.ead import EAD

    # a setting added after the run was made is absent from its config: its default
    given = {
        f.name: run.config[key]
        for f in dataclasses.fields(EAD.Spec)
        if (key := f"exploration.ead.{f.name}") in run.config
    }
    ead, steps = EAD(EAD.Spec(**given), None), int(run.config["train.steps"])
    first = np.asarray(ead.table(1, np.arange(steps)), np.float64)  # [steps]: token 1's
    return {"tau_first_start": float(first[0]), "tau_first_end": float(first[-1]),
            "tau_first_mean": float(first.mean())}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Prediction:
    """docs/lab.md's prediction: `key` of `arm`, minus the same seed's `base_key` (default
    `key`) of arm `base` ("grpo": the arm's own GRPO, BASELINE; "": no difference, the
    arm's value itself), is `direction` ("<" or ">") `threshold`."""

    method: str
    text: str
    arm: str
    key: str
    direction: str = ">"
    threshold: float = 0.0
    base: str = "grpo"
    base_key: str = ""
    # why the verdict says less than it reads (a review of study 1, 2026-12-07): the
    # prediction could not fail, or its threshold was not set apart from what it judges
    no_test: str = ""


P = Prediction
PREDICTIONS = (
    P("EAD", "Pass@64 above GRPO's", "ead", "pass@64"),
    P("EAD", "Pass@64 above temperature 0.7's", "ead", "pass@64", base="cold"),
    P("EAD", "Pass@64 above temperature 1.2's", "ead", "pass@64", base="hot"),
    P("EAD", "Worst@8 not below GRPO's (above -0.01)", "ead", "worst@8", threshold=-0.01),
    P("EAD", "the first token above temperature 1 (its schedule, the mean over steps)", "ead",
      "tau_first_mean", threshold=1.0, base="",
      no_test="read from the schedule, not measured (the realised temperature: the "
      "mechanisms above)"),
    P("EAD", "mean TIS weight within 0.05 of 1", "ead", "tis_gap", "<", 0.05, base="",
      no_test="an importance weight's mean under its own sampling policy is 1 by "
      "construction"),
    P("EDEN", "fewer zero-advantage groups than GRPO's, after the warm-up (both of 8 rows)",
      "eden", "zero_adv", "<"),
    P("EDEN", "higher clean-row token entropy (the last 50 steps)", "eden", "clean_entropy",
      base_key="entropy"),
    P("EDEN", "Pass@64 above GRPO's", "eden", "pass@64"),
    P("EDEN + TIS (follow-up)", "Pass@64 above EDEN's (its collapse is the uncorrected noisy "
      "rows)", "eden_tis", "pass@64", base="eden"),
    P("EDEN + TIS (follow-up)", "Pass@64 at least GRPO's (above -0.01)", "eden_tis", "pass@64",
      threshold=-0.01),
    P("ASE", "answer disagreement above GRPO's (the last 50 steps)", "ase", "disagreement"),
    P("ASE", "the disagreement gap grows (last 50 minus first 50 steps, above GRPO's change)",
      "ase", "disagreement_growth"),
    P("ASE", "Mean@8 at least GRPO's (above -0.01; of 64 samples, as Pass@1)", "ase", "pass@1",
      threshold=-0.01),
    P("ASE", "steered tokens' KL(mu, pi_old) at least 0.01 nats", "ase", "steered_kl",
      threshold=0.01, base="",
      no_test="its threshold is the rule its pilot chose alpha by"),
    P("ExTra", "at least one guided group a step", "extra4", "guided_groups", threshold=1.0,
      base="", no_test="its pilot had measured it before the prediction was judged"),
    P("ExTra", "guided groups solve more often than their problems' hard groups (above 1/8, "
      "a hard group's highest rate)", "extra4", "guided_solve", threshold=1 / 8, base="",
      no_test="1/8 bounds a hard group's rate from above; fresh unguided rollouts of the "
      "same problems were not drawn (the mechanisms above)"),
    P("ExTra", "the chosen prefix's entropy below a random cut's", "extra4", "mte_gap", "<",
      base=""),
    P("ExTra", "Pass@64 above GRPO's", "extra4", "pass@64"),
    P("ExTra", "more distinct correct responses than GRPO's", "extra4", "distinct"),
)  # fmt: skip


def measured(p: Prediction, table: dict) -> dict[int, float]:
    """Prediction `p`'s value on each seed of `table` ({arm: {seed: values}}): the arm's,
    minus its baseline's on the same seed where `p` compares two arms."""
    from explore_rl import analysis

    mine = {s: v.get(p.key) for s, v in table.get(p.arm, {}).items()}
    if not p.base:
        return {s: x for s, x in mine.items() if analysis.finite(x)}
    other = table.get(BASELINE[p.arm] if p.base == "grpo" else p.base, {})
    return analysis.differences(mine, {s: v.get(p.base_key or p.key) for s, v in other.items()})


def judge(p: Prediction, table: dict) -> tuple[tuple, str, str]:
    """(the measured mean and interval, how many of its seeds lie on the predicted side of
    the threshold ("7 of 8"), the verdict) of prediction `p` on `table`."""
    from explore_rl import analysis

    values = measured(p, table)
    stats = analysis.bootstrap_interval(list(values.values()))
    side = sum((x > p.threshold) if p.direction == ">" else (x < p.threshold)
               for x in values.values())  # fmt: skip
    seeds = f"{side} of {len(values)}"
    verdict = analysis.verdict(stats, p.direction, p.threshold)
    if 0 < len(values) < len(SEEDS) and verdict != "not measured":  # docs/lab.md: 8 seeds
        return stats, seeds, f"not judged ({len(values)} of {len(SEEDS)} seeds)"
    if p.no_test and verdict in ("held", "against"):
        return stats, seeds, f"{verdict}, but no test: {p.no_test}"
    # "at least GRPO's" with a margin below 0 holds on an interval wholly below GRPO's
    low, high = stats[1:3]
    beneath = high < 0 if p.direction == ">" else low > 0
    if verdict == "held" and p.base and p.threshold != 0 and beneath:
        return stats, seeds, "held on the margin, but below GRPO (the interval excludes 0)"
    return stats, seeds, verdict


def _cell(stats) -> str:
    """ "mean [low, high]"; the mean alone without an interval (one seed); "" without one."""
    mean, low, high = stats[:3]
    if mean != mean:
        return ""
    return f"{mean:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low == low else " (1 seed)")


def spread(d: dict) -> float:
    """The sd of paired differences {seed: difference} (NaN under 2 seeds): the spread the
    power of a paired comparison follows from."""
    return float(np.std(list(d.values()), ddof=1)) if len(d) > 1 else float("nan")


def checks(done: dict) -> list[str]:
    """Facts a reader needs before the differences: the ratio clip GRPO's updates met, the
    arms whose rollouts equal their GRPO's at every step of every shared seed, and what
    EDEN's anchor screen found."""
    out = []
    for arm in sorted({BASELINE[a] for a in done} & set(done)):
        frames = [r.metrics for r in done[arm].values()]
        if not all("policy/clip_frac_high" in f for f in frames):
            continue
        high = max(f["policy/clip_frac_high"].max() for f in frames)
        low = max(f["policy/clip_frac_low"].max() for f in frames)
        out.append(f"- {arm}: the largest share of tokens clipped in one update, above 1 + "
                   f"eps_high {high:.4f}, below 1 - eps_low {low:.4f}")  # fmt: skip
    for arm, seeds in done.items():
        base = done.get(BASELINE[arm], {})
        shared = sorted(set(seeds) & set(base))
        if arm != BASELINE[arm] and shared and all(_same(seeds[s], base[s]) for s in shared):
            out.append(f"- {arm}: its rollouts equal {BASELINE[arm]}'s at every step (every "
                       f"rollout and reward metric), on all {len(shared)} seeds")  # fmt: skip
    for arm, seeds in done.items():
        screens = [_screen(r.path) for r in seeds.values()]
        if screens and all(screens):
            found = (f"on all {len(screens)} seeds: {screens[0]}" if len(set(screens)) == 1
                     else "per seed: " + "; ".join(screens))  # fmt: skip
            out.append(f"- {arm}: EDEN's anchor screen (each candidate appended to its probe's "
                       f"prompts without noise), {found}")  # fmt: skip
    return out


def screened(path: str) -> tuple[int, list[float], float] | None:
    """A kept EDEN run's anchor screen (eden_bank.json): how many candidates are viable
    (accuracy at least the threshold of the tolerance recorded there, `eden.threshold`),
    every candidate's accuracy and the clean accuracy; None without one."""
    try:
        with open(os.path.join(path, "eden_bank.json")) as f:
            b = json.load(f)
    except OSError:
        return None
    from explore_rl.exploration.eden import threshold

    clean, scores = b["clean_accuracy"], [c["accuracy"] for c in b["candidates"]]
    limit = threshold(clean, b["tolerance"], b.get("tolerance_mode", "absolute"))
    return sum(a >= limit for a in scores), scores, clean


def _screen(path: str) -> str | None:
    """A kept EDEN run's anchor screen in words (eden_bank.json), None without one."""
    if (screen := screened(path)) is None:
        return None
    viable, scores, clean = screen
    return (f"{viable} of {len(scores)} candidates viable (clean accuracy {clean:.3f}, the "
            f"best candidate's {max(scores):.3f})")  # fmt: skip


ROLLOUT_METRICS = ("rollout/", "reward/", "groups/")


def _same(a, b) -> bool:
    """Two runs drew the same rollouts: every rollout metric equal at every step (the
    update's own diagnostics may still differ where the two losses differ on a token)."""
    columns = sorted(c for c in a.metrics.columns if c.startswith(ROLLOUT_METRICS))
    other = sorted(c for c in b.metrics.columns if c.startswith(ROLLOUT_METRICS))
    return columns == other and a.metrics[columns].equals(b.metrics[columns])


def _header(title: str, columns) -> list[str]:
    return ["", f"## {title}", "", "| arm | " + " | ".join(name for _, name in columns) + " |",
            "|---|" + "---|" * len(columns)]  # fmt: skip


# the comparisons inside a method: ASE's directions against unstructured steering (its
# paper's ablation), what composing EAD or TIS changes in EDEN, ExTra against its halves
WITHIN = (("ase", "ase_unstructured"), ("eden_ead", "eden"), ("eden_tis", "eden"),
          ("extra4", "extra_n4"), ("extra4", "extra_r4"))  # fmt: skip


def _paired_row(label: str, arm: str, table: dict, base: str) -> str:
    """A table row: `arm` minus `base` on each seed both have, every column's mean and
    paired interval, after the number of seeds paired."""
    from explore_rl import analysis

    cells, n = [], 0
    for k, _ in FINAL + TRAINING:
        stats = analysis.paired(
            {s: v.get(k) for s, v in table[arm].items()},
            {s: v.get(k) for s, v in table[base].items()},
        )
        cells.append(_cell(stats))
        n = max(n, stats[3])
    return f"| {label} | {n} | " + " | ".join(cells) + " |"


def _row(arm: str, runs: dict, columns) -> str:
    """A table row: each column's mean over the arm's seeds with its interval."""
    from explore_rl import analysis

    cells = [
        _cell(analysis.bootstrap_interval([v.get(k) for v in runs.values()])) for k, _ in columns
    ]
    return f"| {arm} | " + " | ".join(cells) + " |"


def kept_runs(
    runs: str, kept: str, arms=ARMS, evaluations: tuple[Evaluation, ...] = HELD_OUT
) -> dict:
    """{arm: {seed: Run}} of `arms`' runs kept in `kept` with their final `evaluations`,
    after keeping those evaluated in `runs` that are not kept yet; a one-line error when
    there is none."""
    from explore_rl import analysis

    for name in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        path, saved = os.path.join(runs, name), os.path.join(kept, name)
        if _evaluated(path, evaluations) and not _evaluated(saved, evaluations):
            keep(path, saved, None, evaluations)  # ran by whom?
    done = {}
    for name in sorted(os.listdir(kept)) if os.path.isdir(kept) else []:
        arm, _, seed = name.rpartition("-s")
        if arm in arms and _evaluated(os.path.join(kept, name), evaluations):
            done.setdefault(arm, {})[int(seed)] = analysis.load_run(os.path.join(kept, name))
    if not done:
        raise SystemExit(f"error: {runs}, {kept}: no finished run (eval.json) yet")
    return done


def ran_on(done: dict) -> str:
    """The CPU kinds and commits that ran the runs of `done` ({arm: {seed: Run}}), each
    with its runs' folders."""
    kinds = {}
    for run in sorted((r for s in done.values() for r in s.values()), key=lambda r: r.path):
        with open(os.path.join(run.path, "machine.json")) as f:
            m = json.load(f)
        ran = m.get("commit", "before dd0a777") or "not recorded"
        kind = f"{m['cpu']} ({'AVX-512' if m['avx512'] else 'no AVX-512'}), commit {ran}"
        kinds.setdefault(kind, []).append(os.path.basename(run.path))
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in kinds.items())


def report(runs: str, kept: str, out: str, figures: str = FIGURES) -> str:
    """`<out>/study.md` and the figures in `figures` from the runs kept in `kept`, after
    keeping those evaluated in `runs` that are not kept yet (a run counts once its final
    evaluation is written)."""
    from explore_rl import analysis

    done = kept_runs(runs, kept)
    table = {arm: {s: values(r) for s, r in seeds.items()} for arm, seeds in done.items()}
    complete = all(len(done.get(a, {})) >= len(SEEDS) for a in PREREGISTERED)
    seeds = {a: sorted(v) for a, v in done.items()}
    lines = [
        "# The lab study: results",
        "",
        "Written by `python results/lab/lab_study.py` from the runs kept in results/lab/runs; no "
        "number typed by hand. The predictions and settings: docs/lab.md. Each cell: the mean "
        "over seeds [its 95% percentile bootstrap interval]; differences are paired by seed.",
        "",
        (
            "Every pre-registered arm has its 8 seeds (a follow-up arm, docs/lab.md, is "
            "judged once it has its 8 too)."
            if complete
            else "**A pilot, not the study**: not every pre-registered arm has its 8 seeds yet "
            "(below); intervals over fewer seeds are wide and nothing here is a finding."
        ),
        "",
        "Seeds finished: "
        + "; ".join(f"{a} {len(s)} ({','.join(map(str, s))})" for a, s in seeds.items()),
        "",
        "Ran on (a seed's rollouts differ between CPU kinds: a pair across kinds differs by "
        "the kernels too): " + ran_on(done),
    ]
    lines += _header(
        "Held out: 512 test problems x 64 samples at temperature 1, after step 300", FINAL
    )
    lines += [_row(arm, runs_, FINAL) for arm, runs_ in table.items()]
    lines += _header("Against GRPO, paired by seed (arm minus its GRPO: grpo4 for 4-number arms)",
                     (("", "seeds"), *FINAL, *TRAINING))  # fmt: skip
    lines += [_paired_row(arm, arm, table, BASELINE[arm]) for arm in table
              if arm != BASELINE[arm] and BASELINE[arm] in table]  # fmt: skip
    lines += _header("Within a method, paired by seed (the first arm minus the second)",
                     (("", "seeds"), *FINAL, *TRAINING))  # fmt: skip
    lines += [_paired_row(f"{a} - {b}", a, table, b) for a, b in WITHIN
              if a in table and b in table]  # fmt: skip
    lines += _header("Training (each seed's mean, then the mean over seeds)", TRAINING)
    lines += [_row(arm, runs_, TRAINING) for arm, runs_ in table.items()]
    lines += ["", "## Mechanisms as measured", "",
              "Whether each mechanism had room to act (a review of study 1, 2026-12-07): each "
              "value its arm's mean over seeds [interval].", "",
              "| arm | what | measured |", "|---|---|---|"]  # fmt: skip
    for arm, key, text in MECHANISMS:
        if arm in table:
            stats = analysis.bootstrap_interval([v.get(key) for v in table[arm].values()])
            lines.append(f"| {arm} | {text} | {_cell(stats)} |")
    lines += ["", "## Checks", "", *checks(done)]
    lines += [
        "",
        "## The predictions",
        "",
        "Held: the interval excludes the threshold in the predicted direction; against: "
        'in the other; not resolved: it contains it ("at least" and "not below" GRPO: a '
        "threshold of -0.01).",
        "",
        "| method | prediction | arm | measured | seeds on the predicted side | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for p in PREDICTIONS:
        stats, seeds, verdict = judge(p, table)
        lines.append(f"| {p.method} | {p.text} | {p.arm} | {_cell(stats)} | {seeds} | {verdict} |")
    lines += power(table)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "study.md"), "w") as f:
        f.write(text)
    _figures([r for seeds_ in done.values() for r in seeds_.values()], figures)
    return text


def power(table: dict) -> list[str]:
    """The report's power section: for each arm's Pass@64 against its GRPO, the spread of
    its paired differences, the smallest effect its seeds detect at 80% power and the
    seeds POWER_EFFECTS would need (`analysis.detectable`, `analysis.seeds_for`)."""
    from explore_rl import analysis

    head = " | ".join(f"seeds for {e:g}" for e in POWER_EFFECTS)
    lines = ["", "## Power", "",
             "Pass@64 against GRPO, paired by seed: the sd of the per-seed differences, the "
             "smallest true difference the seeds detect with probability 0.8 (a paired t-test "
             "at 5%, two-sided), and the seeds an effect would need at that spread.", "",
             f"| arm | seeds | sd of the differences | detectable | {head} |",
             "|---|---|---|---|" + "---|" * len(POWER_EFFECTS)]  # fmt: skip
    for arm, seeds in table.items():
        base = table.get(BASELINE[arm], {})
        d = analysis.differences(*({s: v.get("pass@64") for s, v in x.items()}
                                   for x in (seeds, base)))  # fmt: skip
        if arm == BASELINE[arm] or len(d) < 2:
            continue
        sd = spread(d)
        need = " | ".join(str(analysis.seeds_for(e, sd)) for e in POWER_EFFECTS)
        lines.append(f"| {arm} | {len(d)} | {sd:.4f} | "
                     f"{analysis.detectable(sd, len(d)):.3f} | {need} |")  # fmt: skip
    return lines


SMOOTH = 20  # steps a learning curve's moving average spans (a step's 16 groups are noisy)


def _figures(runs, folder: str) -> None:
    """Learning curves with seed bands, Pass@k with intervals, each method's panel."""
    from explore_rl import analysis

    for r in runs:  # labels: the folder's arm (runs of one arm are its seeds)
        r.label = os.path.basename(r.path).rpartition("-s")[0]
    os.makedirs(folder, exist_ok=True)
    figures = {
        "curves": analysis.plot_curves(runs, smooth=SMOOTH),
        "pass_at_k": analysis.plot_pass_at_k(runs),
    }
    figures.update({m: analysis.plot_method(runs, m) for m in analysis.PANELS})
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(os.path.join(folder, f"{name}.png"), dpi=110)


if __name__ == "__main__":
    main()

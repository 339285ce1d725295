"""The lab's LoRA study: GRPO with LoRA adapters of rank 1, 8 and 32 on every linear layer
against full fine-tuning, from one base model, each at its own learning rate, 5 seeds x 300
steps an arm, paired by seed. The question and the rule for each verdict, written before
the runs: docs/lab.md, "LoRA against full fine-tuning".

    python results/lab/lora_study.py --pilot     # the learning rates: pilot_lora.md, .json
    python results/lab/lora_study.py             # every run (it resumes), then lora_study.md
    python results/lab/lora_study.py --report    # the report of the runs kept so far

The pilot runs each rank at each of LRS on seed PILOT_SEED (not a study seed) for
PILOT_STEPS steps and keeps, per rank, the learning rate with the highest held-out Pass@1
at the last step (512 problems x 8 samples); full fine-tuning keeps the lab's 3e-5, chosen
by the same rule in results/lab/pilot.md. The study's arms read the pilot's choice from
pilot_lora.json. A finished run is kept as study 1's are (`lab_study.keep`), in
results/lab/runs/<arm>-s<seed>/; every number in the reports comes from the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_study  # noqa: E402

RANKS = (1, 8, 32)
LRS = (1e-4, 3e-4, 1e-3)  # 3x-33x full fine-tuning's 3e-5 ("LoRA Without Regret": ~10x)
FULL_LR = 3e-5  # configs/lab.py, results/lab/pilot.md
PILOT_SEED, PILOT_STEPS = 100, 150
SEEDS = tuple(range(5))
MARGIN = 0.02  # "matches": the paired interval within +-MARGIN (docs/lab.md)
ARMS = ("full", *(f"lora{r}" for r in RANKS))
CHOSEN = "results/lab/pilot_lora.json"
PASS1 = "eval/average/pass@1"


def arm_config(arm: str, seed: int, lr: float | None = None):
    """The lab's GRPO config at `seed` with the arm's adapters (none for "full") and its
    learning rate: `lr`, or the pilot's choice."""
    c = lab_study.arm_config("grpo", seed)
    if arm != "full":
        c.model.lora.rank = int(arm.removeprefix("lora"))
    c.optim.lr = lr if lr is not None else chosen_lr(arm)
    return c


def chosen_lr(arm: str) -> float:
    if arm == "full":
        return FULL_LR
    if not os.path.exists(CHOSEN):
        raise SystemExit(f"error: {CHOSEN}: no learning rates yet (run --pilot first)")
    with open(CHOSEN) as f:
        return float(json.load(f)[arm])


def choose(rows: list[dict]) -> dict[str, float]:
    """Per arm, the learning rate of its highest held-out Pass@1 (ties: the smaller rate);
    `rows`: {"arm", "lr", "pass@1"} each, a run that fell (NaN) never chosen."""
    best = {}
    for r in sorted(rows, key=lambda r: r["lr"]):
        score = r["pass@1"] if np.isfinite(r["pass@1"]) else -np.inf
        if r["arm"] not in best or score > best[r["arm"]][1]:
            best[r["arm"]] = (r["lr"], score)
    return {arm: lr for arm, (lr, _) in best.items()}


def beyond(rows: list[dict]) -> list[tuple[str, float]]:
    """(arm, rate) to run next: where an arm's chosen rate is the edge of the rates it ran,
    3x past that edge (docs/lab.md's amendment: the optimum may lie outside the grid)."""
    out = []
    for arm, lr in choose(rows).items():
        ran = sorted(r["lr"] for r in rows if r["arm"] == arm)
        if not any(r["arm"] == arm and np.isfinite(r["pass@1"]) for r in rows):
            continue  # every rate fell: no edge to move past
        if lr == ran[0]:
            out.append((arm, float(f"{lr / 3:.3g}")))
        elif lr == ran[-1]:
            out.append((arm, float(f"{lr * 3:.3g}")))
    return out


def pilot(runs: str) -> tuple[str, dict]:
    """Every rank at every rate of LRS, then 3x past an edge that wins (`beyond`, until
    none does; `PILOT_STEPS` steps each, evaluated every 50): the report's text and the
    chosen rates."""
    from explore_rl import config as config_lib
    from explore_rl.logs import read_metrics
    from explore_rl.train import loop

    rows = []
    todo = [(arm, lr) for arm in ARMS[1:] for lr in LRS]
    while todo:
        for arm, lr in todo:
            c = arm_config(arm, PILOT_SEED, lr)
            c.train.steps, c.train.eval_before = PILOT_STEPS, False
            path = os.path.join(runs, f"{arm}-lr{lr:g}-s{PILOT_SEED}")
            loop.train(config_lib.spec(c), path)
            metrics = read_metrics(path)
            held = {r["step"]: r[PASS1] for r in metrics if PASS1 in r}
            rewards = [r["reward/mean"] for r in metrics]
            kl = [r["policy/approx_kl"] for r in metrics if "policy/approx_kl" in r]
            rows.append({"arm": arm, "lr": lr, "pass@1": held.get(PILOT_STEPS, float("nan")),
                         "held": held, "reward_first": float(np.mean(rewards[:20])),
                         "reward_last": float(np.mean(rewards[-20:])),
                         "kl": float(np.median(kl)) if kl else float("nan")})  # fmt: skip
        todo = beyond(rows)
    rows.sort(key=lambda r: (ARMS.index(r["arm"]), r["lr"]))
    chosen = choose(rows)
    evals = sorted({s for r in rows for s in r["held"]})
    lines = [f"# The LoRA learning-rate pilot (seed {PILOT_SEED}, {PILOT_STEPS} steps; "
             f"{lab_study.machine()['cpu']})", "",
             "Each row: `arm_config(arm, seed, lr)` of results/lab/lora_study.py (the lab's "
             "GRPO with `model.lora.rank` set, adapters on every linear layer, alpha 32) run "
             f"for {PILOT_STEPS} steps without a step-0 evaluation; the columns read from its "
             "metrics.jsonl. The rule (docs/lab.md): per rank, the highest held-out Pass@1 at "
             f"step {PILOT_STEPS}, the grid extended 3x past an edge that wins.", "",
             "| arm | lr | training reward, steps 1-20 | last 20 steps | held-out Pass@1 at "
             f"step {' / '.join(map(str, evals))} | approx KL a step (median) | chosen |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        held = " / ".join(f"{r['held'][s]:.3f}" if s in r["held"] else "-" for s in evals)
        mark = "**yes**" if chosen[r["arm"]] == r["lr"] else ""
        lines.append(f"| {r['arm']} | {r['lr']:g} | {r['reward_first']:.3f} | "
                     f"{r['reward_last']:.3f} | {held} | {r['kl']:.1e} | {mark} |")  # fmt: skip
    lines += ["", "Chosen: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items())
              + f"; full fine-tuning {FULL_LR:g} (results/lab/pilot.md)."]  # fmt: skip
    return "\n".join(lines) + "\n", chosen


# (value, what it is): the held-out numbers the report compares, paired by seed
FINAL = (("pass@1", "Pass@1"), ("pass@8", "Pass@8"), ("pass@64", "Pass@64"))


def table_of(kept: str) -> dict:
    """{arm: {seed: values}} of the kept runs: the held-out Pass@k after the last step and
    the gain in held-out Pass@1 over the base model (step 0)."""
    from explore_rl import analysis

    table = {}
    for arm in ARMS:
        for seed in SEEDS:
            path = os.path.join(kept, f"{arm}-s{seed}")
            if not lab_study._evaluated(path):
                continue
            run = analysis.load_run(path)
            v = {k: run.final.get(f"eval/average/{k}") for k, _ in FINAL}
            if 0 in run.metrics.index and PASS1 in run.metrics:
                v["gain"] = v["pass@1"] - float(run.metrics.loc[0, PASS1])
            table.setdefault(arm, {})[seed] = v
    return table


def equivalence(stats) -> str:
    """A "matches" verdict: held when the paired interval lies within +-MARGIN (both
    one-sided predictions hold), against when it lies wholly outside, else not resolved."""
    from explore_rl import analysis

    above = analysis.verdict(stats, ">", -MARGIN)
    below = analysis.verdict(stats, "<", MARGIN)
    if "not measured" in (above, below):
        return "not measured"
    if above == below == "held":
        return "held"
    return "against" if "against" in (above, below) else "not resolved"


def report(kept: str) -> str:
    from explore_rl import analysis

    table = table_of(kept)
    if not table:
        raise SystemExit(f"error: {kept}: no finished LoRA study run (eval.json) yet")
    complete = all(len(table.get(a, {})) == len(SEEDS) for a in ARMS)
    cell = lab_study._cell
    lines = ["# The lab's LoRA study: results", "",
             "Written by `python results/lab/lora_study.py` from the runs kept in "
             "results/lab/runs; no number typed by hand. The question, the rule and the "
             "settings: docs/lab.md, \"LoRA against full fine-tuning\". Each cell: the mean "
             "over seeds [its 95% percentile bootstrap interval].", "",
             "Every arm has its 5 seeds." if complete else
             "**Not the study yet**: not every arm has its 5 seeds (below); nothing here is "
             "a finding.", "",
             "Seeds finished: " + "; ".join(f"{a} {sorted(s)}" for a, s in table.items())
             + ". Learning rates: " + ", ".join(
                 f"{a} {chosen_lr(a):g}" for a in ARMS if a == "full" or os.path.exists(CHOSEN)),
             "", "## Held out: 512 test problems x 64 samples at temperature 1, after step 300",
             "", "| arm | " + " | ".join(t for _, t in FINAL) + " | Pass@1 gain over the base "
             "model |", "|---|" + "---|" * (len(FINAL) + 1)]  # fmt: skip
    for arm, runs_ in table.items():
        row = [cell(analysis.bootstrap_interval([v.get(k) for v in runs_.values()]))
               for k in (*(k for k, _ in FINAL), "gain")]  # fmt: skip
        lines.append(f"| {arm} | " + " | ".join(row) + " |")
    lines += ["", "## The mechanism check: the adapters learn", "",
              "Held-out Pass@1 after step 300 minus the base model's (step 0), each arm: held "
              "when the interval lies above 0. Judged before the comparisons: an arm that "
              "does not learn matches nothing.", "",
              "| arm | gain | verdict |", "|---|---|---|"]  # fmt: skip
    for arm, runs_ in table.items():
        stats = analysis.bootstrap_interval([v.get("gain") for v in runs_.values()])
        judged = analysis.verdict(stats, ">") if len(runs_) == len(SEEDS) else (
            f"not judged ({len(runs_)} of {len(SEEDS)} seeds)")  # fmt: skip
        lines.append(f"| {arm} | {cell(stats)} | {judged} |")
    lines += ["", "## Against full fine-tuning, paired by seed", "",
              f"Held: the interval of (arm - full) lies within +-{MARGIN}; against: wholly "
              "outside; not resolved: otherwise. The primary comparison is rank 1's (both "
              "numbers); ranks 8 and 32 are secondary (docs/lab.md: their verdicts are "
              "descriptive).", "",
              "| arm | value | arm - full | seeds | sd of the differences | detectable | "
              "verdict |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in (a for a in ARMS[1:] if a in table):
        for key, text in FINAL:
            d = analysis.differences(*({s: v.get(key) for s, v in table.get(a, {}).items()}
                                       for a in (arm, "full")))  # fmt: skip
            stats = analysis.bootstrap_interval(list(d.values()))
            sd = float(np.std(list(d.values()), ddof=1)) if len(d) > 1 else float("nan")
            power = f"{analysis.detectable(sd, len(d)):.3f}" if len(d) > 1 else ""
            judged = equivalence(stats) if len(d) == len(SEEDS) else (
                f"not judged ({len(d)} of {len(SEEDS)} seeds)")  # fmt: skip
            if key == "pass@8":
                judged = "(not predicted)"
            lines.append(f"| {arm} | {text} | {cell(stats)} | {len(d)} | {sd:.4f} | {power} | "
                         f"{judged} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="runs/lora-study")
    p.add_argument("--kept", default=lab_study.KEPT, help="the finished runs (committed)")
    p.add_argument("--out", default="results/lab")
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--report", action="store_true", help="only the report of the runs kept")
    p.add_argument("--pilot", action="store_true", help="the learning-rate pilot")
    args = p.parse_args(argv)

    from explore_rl import caching

    caching.enable_compilation_cache()
    if args.pilot:
        text, chosen = pilot(os.path.join(args.runs, "pilot"))
        with open(os.path.join(args.out, "pilot_lora.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "pilot_lora.json"), "w") as f:
            json.dump(chosen, f, indent=1)
        print(text)
        return
    if not args.report:
        lab_study.run_study(args.runs, args.kept, list(ARMS), args.seeds, arm_config)
    text = report(args.kept)
    with open(os.path.join(args.out, "lora_study.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()

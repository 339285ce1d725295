"""The lab's second study (lab v2, docs/lab.md): every method and two temperature controls
against GRPO from lab v2's base model, 8 seeds x 300 steps an arm, paired by seed; then
the focused experiments (EAD against a fixed temperature at its own realised mean level and
against its own realised level step by step without the schedule's shape, ASE against its
random-direction and shuffled-label ablations); the report judges each method's mechanism
checks before its primary endpoint.

    python results/lab/study2.py                                  # every run, then the report
    python results/lab/study2.py --arms grpo ead --seeds 0 1      # a part of it
    python results/lab/study2.py --arms ead_fixed ead_flat        # focused, after the study
    python results/lab/study2.py --report                         # the report of the runs kept

Runs go as study 1's (results/lab/lab_study.py: `run_study`): seed by seed, each resumed
where it stopped, the study's arms before the focused ones (the levels ead_fixed and ead_flat
sample at are read from the kept EAD runs when their configs are made). A
run counts once both its final evaluations of its last checkpoint are written in its
folder: eval.json (the 512 test problems x 64 samples at temperature 1, with the diversity
measures) and eval_sweep.json (16 samples at each of SWEEP, and at the run's own training
temperature where that is not 1). What the report reads of it is kept, committed, in
results/lab/runs2/<arm>-s<seed>/; the report (`<out>/study2.md`) and its figures are
written from the kept runs alone.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_study  # noqa: E402

SEEDS = lab_study.SEEDS
KEPT = "results/lab/runs2"
FIGURES = "results/lab/figures/study2"
SWEEP = ("0.6", "0.8", "1.0", "1.2", "rollout")
EVALUATIONS = (
    lab_study.Evaluation(),  # the primary: 512 x 64 at temperature 1, eval.json
    lab_study.Evaluation("eval_sweep", samples=16, diversity=False, temperatures=SWEEP),
)
WARMUP = lab_study.WARMUP  # "after warm-up": steps > 30
RECURRING = 40  # ExTra's memories read from steps > 40 (each problem drawn again by then)
MARGIN = 0.02  # "no difference": the paired interval inside (-MARGIN, MARGIN)

# arm -> (config, overrides), each lab v2's GRPO with one thing changed (lab_study.arm_config)
ARMS = {
    "grpo": ("configs/grpo.py:lab2", {}),
    "cold": ("configs/grpo.py:lab2", {"rollout.temperature": 0.7}),  # fixed T, trained cold
    "hot": ("configs/controls.py:temperature,lab2", {}),  # fixed T 1.2, trained hot
    "ead": ("configs/ead.py:lab2", {}),
    "ase": ("configs/ase.py:lab2", {}),
    "extra": ("configs/extra.py:lab2", {}),  # the full method: novelty + regeneration
    # a screen with fewer than K viable anchors tops its bank up rather than refusing: the
    # run goes on and EDEN's check (at least K viable on every seed) reports it failed
    "eden": ("configs/eden.py:lab2", {"exploration.eden.allow_unviable": True}),
    # focused, at EAD's realised temperature (LEVELLED): GRPO at its mean over the run, and
    # EAD with its TIS drawing each step's every token at that step's mean (no shape)
    "ead_fixed": ("configs/grpo.py:lab2", {}),
    "ead_flat": ("configs/ead.py:lab2", {}),
    "ase_random": ("configs/ase.py:random_directions,lab2", {}),
    "ase_shuffled": ("configs/ase.py:shuffled_labels,lab2", {}),
}
STUDY = ["grpo", "cold", "hot", "ead", "ase", "extra", "eden"]
FOCUSED = ["ead_fixed", "ead_flat", "ase_random", "ase_shuffled"]
# (arm, against): the focused tables, the first arm minus the second, paired by seed; EAD
# minus ead_fixed = (EAD minus ead_flat: the shape) + (ead_flat minus ead_fixed: the level's
# course over training, and the scoring: pi_old at 1 with TIS against on-policy at the level)
WITHIN = (
    ("ead", "ead_fixed"), ("ead", "ead_flat"), ("ead_flat", "ead_fixed"),
    ("ase", "ase_random"), ("ase", "ase_shuffled"),
)  # fmt: skip


def arm_config(arm: str, seed: int, kept: str = KEPT):
    """The arm's config at `seed`, its base model resolved; a LEVELLED arm's setting read
    from the kept EAD runs' realised temperatures."""
    arms = ARMS
    if arm in LEVELLED:
        setting, level = LEVELLED[arm]
        arms = {arm: (ARMS[arm][0], {setting: level(kept)})}
    return lab_study.arm_config(arm, seed, arms)


def ead_temperatures(kept: str) -> np.ndarray:
    """[seed, step]: the mean token temperature the EAD runs kept in `kept` drew at each
    training step ("rollout/temperature"; step s's rollouts are drawn at 0-based index
    s - 1); a one-line error until every seed's is kept (read earlier, a LEVELLED arm's
    seeds would run at different levels, and a run resumed after more were kept would no
    longer be the run it was)."""
    from explore_rl import analysis

    paths = [os.path.join(kept, f"ead-s{s}") for s in SEEDS]
    missing = [s for s, p in zip(SEEDS, paths) if not lab_study._evaluated(p, EVALUATIONS)]
    if missing:
        raise SystemExit(
            f"error: {', '.join(LEVELLED)}: EAD's seeds {missing} are not kept in {kept}; "
            "the levels are read from all of them (run the study's arms first)"
        )
    drawn = [analysis.load_run(p).metrics["rollout/temperature"].dropna() for p in paths]
    steps = drawn[0].index
    if any(not d.index.equals(steps) for d in drawn) or list(steps) != [*range(1, len(steps) + 1)]:
        raise SystemExit(f"error: {kept}: EAD's runs did not log a temperature at every step")
    return np.stack([d.to_numpy() for d in drawn])


def ead_level(kept: str) -> float:
    """ead_fixed's temperature: EAD's realised mean over its seeds and steps, to 0.01."""
    return round(float(ead_temperatures(kept).mean()), 2)


def ead_levels(kept: str) -> tuple[float, ...]:
    """ead_flat's levels: at each step EAD's realised temperature, the mean over its seeds,
    to 0.001."""
    return tuple(round(float(x), 3) for x in ead_temperatures(kept).mean(axis=0))


# the focused arms drawn at EAD's realised temperature: the setting, and its value's reader
LEVELLED = {
    "ead_fixed": ("rollout.temperature", ead_level),
    "ead_flat": ("exploration.ead.levels", ead_levels),
}


def run(runs: str, kept: str, arms: list[str], seeds: list[int]) -> None:
    """The study's arms seed by seed, then the focused ones (`lab_study.run_study`)."""
    config = functools.partial(arm_config, kept=kept)
    for group in (STUDY, FOCUSED):
        chosen = [a for a in group if a in arms]
        if chosen:
            lab_study.run_study(runs, kept, chosen, seeds, config, EVALUATIONS)


def main(argv=None) -> None:
    p = lab_study.parser(__doc__, "runs/lab-study2", KEPT, FIGURES, list(ARMS), list(ARMS))
    args = p.parse_args(argv)

    from explore_rl import caching

    caching.enable_compilation_cache()
    os.makedirs(args.out, exist_ok=True)
    if not args.report:
        run(args.runs, args.kept, args.arms, args.seeds)
    print(report(args.runs, args.kept, args.out, args.figures))


# ---------------------------------------------------------------------------------- values


def values(run) -> dict[str, float]:
    """One run's numbers: study 1's (`lab_study.values`), its mechanism checks' values, the
    fixed-count diversity measures of eval.json and its sweep's Pass@1 and Pass@16."""
    out = lab_study.values(run)
    out["trained_at"] = float(run.config["rollout.temperature"])
    out.update(_mechanisms(run))
    clean, noisy = out.get("clean_reward"), out.get("noisy_reward")
    if clean and noisy is not None:  # EDEN's rows, every step: noisy over clean
        out["noisy_ratio"] = noisy / clean
    out.update(_fixed_count(run.final))
    out.update(_sweep(run.path))
    return out


def _mechanisms(run) -> dict[str, float]:
    """The values the mechanism checks (CHECKS) judge, of this run's method."""
    m, c, out = run.metrics, run.config, {}

    def series(key, after=0):
        return m[key].dropna()[lambda x: x.index > after] if key in m else None

    if "ead" in run.methods:
        first, last = series("rollout/temperature_first"), series("rollout/temperature_last")
        if first is not None and last is not None:
            out["profile"] = float(first.mean() - last.mean())
        if (kl := series("policy/kl_mu_old")) is not None:
            out["kl_median"] = float(kl.median())
    if "ase" in run.methods:
        if (updates := series("ase/updates")) is not None:
            out["ase_updates"] = float(updates.max())
        if (alignment := series("ase/alignment")) is not None:  # logged from the 2nd update
            out["alignment"] = float(alignment.mean()) if len(alignment) else None
        g, k = int(c["rollout.group_size"]), int(c["exploration.ase.k"])
        unstructured = c.get("exploration.ase.routing") == "unstructured"
        out["steered_share"] = 1.0 if unstructured else lab_study._steered_share(g, k)
    if "extra" in run.methods:
        for key in ("novelty_recalled", "prefix_recalled"):
            if (x := series(f"extra/{key}", RECURRING)) is not None:
                out[key] = float(x.mean())
    if "eden" in run.methods:
        screen = lab_study.screened(run.path)  # its viable anchors, as recorded
        out["viable"] = None if screen is None else float(screen[0])
    return out


# eval.diversity's fixed-count measures: of all n responses and of the first m correct (the
# variable-count ones, over however many were correct, track accuracy: left out)
FIXED_COUNT = re.compile(
    r"^eval/average/((?:distinct4|self_bleu|logdet|solutions)@\d+(?:correct)?)$"
)
MEASURES = {"distinct4": "distinct-4", "self_bleu": "Self-BLEU", "logdet": "MiniLM LogDet",
            "solutions": "distinct solution trees a problem"}  # fmt: skip


def _fixed_count(final: dict) -> dict[str, float]:
    return {m.group(1): v for k, v in final.items() if (m := FIXED_COUNT.match(k))}


def _sweep(path: str) -> dict[str, float]:
    """eval_sweep.json's Pass@1 and Pass@16 at each temperature, as "T_<label>/pass@<k>"."""
    from explore_rl.analysis import SWEEP as PREFIX

    try:
        with open(os.path.join(path, "eval_sweep.json")) as f:
            sweep = json.load(f)
    except OSError:
        return {}
    pattern = re.compile(rf"^eval/average/({PREFIX}[^/]+/pass@(?:1|16))$")
    return {m.group(1): v for k, v in sweep.items() if (m := pattern.match(k))}


def _label(key: str) -> str:
    """A secondary's name in words."""
    if key.startswith("T_"):
        label, metric = key[2:].split("/")
        return f"{metric.replace('pass', 'Pass')} at T {label}"
    name, _, count = key.partition("@")
    if name in MEASURES:
        of = f"first {count[:-7]} correct" if count.endswith("correct") else f"all {count}"
        return f"{MEASURES[name]}, {of}"
    return dict(lab_study.FINAL).get(key, key)


# ---------------------------------------------------------------------------------- checks


@dataclasses.dataclass(frozen=True)
class Check:
    """A mechanism check: value `key` of `arm`'s runs (`values`) passes when the mean over
    seeds (every seed's, with `every_seed`) lies in [low, high]; neither bound: reported."""

    method: str
    arm: str
    key: str
    text: str
    low: float | None = None
    high: float | None = None
    every_seed: bool = False

    def threshold(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in [{self.low:.4g}, {self.high:.4g}]"
        if self.low is not None:
            return f">= {self.low:g}" + (" on every seed" if self.every_seed else "")
        return f"<= {self.high:g}" if self.high is not None else "(reported)"

    def meets(self, x: float) -> bool:
        return (self.low is None or x >= self.low) and (self.high is None or x <= self.high)


C = Check
CHECKS = (
    C("ead", "ead", "profile", "realised profile: first token's temperature minus the last's, "
      "the mean over steps", low=0.10),
    C("ead", "ead", "temperature", "realised level: mean token temperature, every step "
      "(ead_fixed's temperature)"),
    C("ead", "ead", "kl_median", "behaviour/old-policy gap: median over steps of "
      "KL(mu, pi_old) a token", high=0.05),
    C("ase", "ase", "ase_updates", "the bank updates: its updates in the run", low=5),
    C("ase", "ase", "alignment", "direction stability: matched directions' cosine between "
      "consecutive banks, the mean over updates after the first", low=0.5),
    C("ase", "ase", "steered_share", "steered rows' share of a batch, as configured"),
    C("extra", "extra", "novelty_recalled", f"recurrence: share of solved groups whose problem "
      f"the novelty memory holds, steps > {RECURRING}", low=0.5),
    C("extra", "extra", "prefix_recalled", f"memory occupancy: share of hard groups whose "
      f"problem has stored prefixes, steps > {RECURRING}", low=0.5),
    C("extra", "extra", "guided_share", f"guided rows' share of a step's rows, steps > "
      f"{WARMUP} (the paper's ~1/16)", low=1 / 32, high=1 / 16),
    C("extra", "extra", "guided_solve", "guided rows' solve rate (descriptive)"),
    C("extra", "grpo", "accuracy", f"beside it: GRPO's rows' solve rate, steps > {WARMUP}"),
    C("eden", "eden", "viable", "viable anchors of the screen's candidates (K = 8)", low=8,
      every_seed=True),
    C("eden", "eden", "noisy_ratio", "noisy rows' reward over the clean rows', every step",
      low=0.5),
    # focused, descriptive: the flat arm's level as drawn, beside EAD's (equal by design)
    C("ead_flat", "ead_flat", "temperature", "realised level: mean token temperature, every "
      "step"),
    C("ead_flat", "ead", "temperature", "beside it: EAD's"),
    C("ead_flat", "ead_flat", "profile", "realised profile: first token's temperature minus "
      "the last's (EAD's above)"),
    C("ead_flat", "ead_flat", "kl_median", "behaviour/old-policy gap TIS corrects: median "
      "over steps of KL(mu, pi_old) a token"),
    C("ead_flat", "ead", "kl_median", "beside it: EAD's"),
)  # fmt: skip


def check(c: Check, table: dict) -> tuple[tuple, str]:
    """(the mean over seeds with its 95% t interval (NaN under 2 seeds), the verdict:
    "passed", "failed", "reported" or "not measured")."""
    from explore_rl import analysis

    seeds = [v.get(c.key) for v in table.get(c.arm, {}).values()]
    xs = [x for x in seeds if analysis.finite(x)]
    stats = analysis.t_interval(xs)
    if not xs:
        return stats, "not measured"
    if c.low is None and c.high is None:
        return stats, "reported"
    # every seed's: a seed that measured nothing has not met it
    passed = (
        (len(xs) == len(seeds) and all(map(c.meets, xs))) if c.every_seed else c.meets(stats[0])
    )
    return stats, "passed" if passed else "failed"


def mechanism_failed(method: str, table: dict) -> bool:
    """Whether a check of `method` with a threshold failed or could not be measured."""
    judged = [c for c in CHECKS if c.method == method and (c.low, c.high) != (None, None)]
    return any(check(c, table)[1] in ("failed", "not measured") for c in judged)


def verdict(stats) -> str:
    """The primary endpoint's verdict on a paired interval (mean, low, high, ...)."""
    mean, low, high = stats[:3]
    if not np.isfinite(mean):
        return "not measured"
    if not (np.isfinite(low) and np.isfinite(high)):
        return "not resolved"
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    if -MARGIN < low and high < MARGIN:
        return f"no difference of {MARGIN} or more"
    return "not resolved"


CAVEAT = " (mechanism check failed: measures the lab, not the method)"


# ---------------------------------------------------------------------------------- report

PRIMARY = "pass@64"
SECONDARY = ("pass@1", "pass@8", "worst@8", "other@64")  # then eval.json's fixed-count
# diversity measures and the sweep's Pass@1 and Pass@16 at each temperature (`_secondaries`)


def report(runs: str, kept: str, out: str, figures: str = FIGURES) -> str:
    """`<out>/study2.md` and the figures in `figures` from the runs kept in `kept`, after
    keeping those of `runs` with both final evaluations that are not kept yet."""
    from explore_rl import analysis

    done = lab_study.kept_runs(runs, kept, ARMS, EVALUATIONS)
    table = {a: {s: values(r) for s, r in sorted(done[a].items())} for a in ARMS if a in done}
    complete = all(len(done.get(a, {})) >= len(SEEDS) for a in STUDY) and all(
        len(seeds) >= len(SEEDS) for seeds in done.values()
    )
    lines = [
        "# The lab's second study (lab v2): results",
        "",
        "Written by `python results/lab/study2.py` from the runs kept in results/lab/runs2; no "
        "number typed by hand. The settings and the rules: docs/lab.md. Each method's "
        "mechanism checks come before its primary endpoint: a method whose checks failed had "
        "no room to act, and its comparison measures the lab. Intervals: Student t over "
        "seeds, differences paired by seed.",
        "",
        "Every arm has its 8 seeds."
        if complete
        else "**A pilot, not the study**: not every arm has its 8 seeds yet (below); intervals "
        "over fewer seeds are wide and nothing here is a finding.",
        "",
        "Seeds finished: "
        + "; ".join(f"{a} {len(s)} ({','.join(map(str, s))})" for a, s in table.items()),
        "",
        "Ran on (a seed's rollouts differ between CPU kinds: a pair across kinds differs by "
        "the kernels too): " + lab_study.ran_on(done),
        "",
        "## Held out: 512 test problems x 64 samples at temperature 1, after step 300",
        "",
        "| arm | seeds | Pass@1 | Pass@8 | Pass@64 |",
        "|---|---|---|---|---|",
    ]
    for arm, seeds in table.items():
        cells = [
            _cell(analysis.t_interval([v.get(k) for v in seeds.values()]))
            for k in ("pass@1", "pass@8", PRIMARY)
        ]
        lines.append(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + " |")
    for arm in STUDY[1:]:
        if arm in table:
            lines += _method(arm, table)
    lines += _focused(table, done)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "study2.md"), "w") as f:
        f.write(text)
    _figures(done, figures)
    return text


_cell = lab_study._cell


def _paired(table: dict, arm: str, base: str, key: str, level: float = 0.95):
    """(mean, low, high, n) of `arm` minus `base` on `key`, paired t at `level`."""
    from explore_rl import analysis

    arm_, base_ = ({s: v.get(key) for s, v in table[a].items()} for a in (arm, base))
    return analysis.paired(arm_, base_, interval=analysis.t_interval, level=level)


def _method(arm: str, table: dict) -> list[str]:
    """An arm's section: its mechanism checks, then its primary endpoint, then its
    secondaries."""
    lines = ["", f"## {arm} ({ARMS[arm][0]})", "", "### Mechanism checks", ""]
    checks = [c for c in CHECKS if c.method == arm]
    if not checks:
        lines += ["A control: no mechanism checks.", *_own_temperature(arm, table)]
    else:
        lines += _checks(checks, table)
    lines += ["", f"### Primary endpoint: held-out Pass@64 at T 1, {arm} minus grpo", ""]
    if "grpo" not in table:
        return [*lines, "No grpo run to pair with."]
    stats = _paired(table, arm, "grpo", PRIMARY)
    if not checks:  # docs/lab.md: one primary endpoint a method, the controls have none
        said = "a control: no prediction"
    else:
        said = verdict(stats) + (CAVEAT if mechanism_failed(arm, table) else "")
    lines += _primary_table([(arm, stats, _sd(table, arm, "grpo"), said)])
    keys = _secondaries(table, arm)
    m = len(keys)
    level = 1 - 0.05 / max(m, 1)
    lines += ["", "### Secondary (descriptive)", "",
              f"{arm} minus grpo, paired by seed; each of its {m} secondaries at a "
              f"Bonferroni-adjusted {level:.4f} interval (1 - 0.05/{m}); no verdicts.", "",
              "| measure | seeds | difference |", "|---|---|---|"]  # fmt: skip
    for key in keys:
        stats = _paired(table, arm, "grpo", key, level)
        lines.append(f"| {_label(key)} | {stats[3]} | {_cell(stats)} |")
    return lines


def _checks(checks: list[Check], table: dict) -> list[str]:
    """The mechanism checks' table: each check's mean over seeds and its verdict."""
    lines = ["| check | arm | measured | threshold | verdict |", "|---|---|---|---|---|"]
    for c in checks:
        stats, said = check(c, table)
        lines.append(f"| {c.text} | {c.arm} | {_cell(stats)} | {c.threshold()} | {said} |")
    return lines


def _own_temperature(arm: str, table: dict) -> list[str]:
    """A control sampled at the temperature it trained at (its sweep's "rollout", or the
    swept temperature equal to it), beside GRPO at T 1: what study 1 lacked, unpaired."""
    from explore_rl import analysis

    runs = list(table[arm].values())
    t = runs[0]["trained_at"]
    own = next((k for k in ("T_rollout", f"T_{t:g}") if any(f"{k}/pass@1" in v for v in runs)),
               None)  # fmt: skip
    if own is None:
        return []
    lines = ["", f"### At its own training temperature (T {t:g}), beside grpo at T 1", "",
             "| arm | temperature | seeds | Pass@1 | Pass@16 |",
             "|---|---|---|---|---|"]  # fmt: skip
    for who, key, at in ((arm, own, f"{t:g}"), ("grpo", "T_1", "1")):
        seeds = table.get(who, {})
        cells = [_cell(analysis.t_interval([v.get(f"{key}/{m}") for v in seeds.values()]))
                 for m in ("pass@1", "pass@16")]  # fmt: skip
        lines.append(f"| {who} | {at} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def _secondaries(table: dict, arm: str) -> list[str]:
    """SECONDARY, then the fixed-count diversity measures and the sweep's values both `arm`
    and grpo have on some seed, in a stable order."""
    had = [
        {k for v in table[a].values() for k, x in v.items() if x is not None} for a in (arm, "grpo")
    ]
    both = had[0] & had[1]
    fixed = sorted(k for k in both if FIXED_COUNT.match(f"eval/average/{k}"))
    swept = sorted((k for k in both if k.startswith("T_")), key=_sweep_order)
    return [k for k in SECONDARY if k in both] + fixed + swept


def _sweep_order(key: str):
    label, metric = key[2:].split("/")
    return (label == "rollout", float(label) if label != "rollout" else 0.0, metric)


def _sd(table: dict, arm: str, base: str) -> float:
    from explore_rl import analysis

    d = analysis.differences(
        *({s: v.get(PRIMARY) for s, v in table[a].items()} for a in (arm, base))
    )
    return lab_study.spread(d)


def _primary_table(rows) -> list[str]:
    """Rows (label, paired stats, sd of the differences, verdict): Pass@64's difference, the
    power it had (the smallest effect its seeds detect at 80%, `analysis.detectable`)."""
    from explore_rl import analysis

    lines = ["| comparison | seeds | difference [95% paired t] | sd of the differences | "
             "detectable at 80% power | verdict |", "|---|---|---|---|---|---|"]  # fmt: skip
    for label, stats, sd, said in rows:
        n = stats[3]
        power = f"{analysis.detectable(sd, n):.3f}" if n >= 2 else ""
        spread = f"{sd:.4f}" if n >= 2 else ""
        lines.append(f"| {label} | {n} | {_cell(stats)} | {spread} | {power} | {said} |")
    return lines


def _focused(table: dict, done: dict) -> list[str]:
    """The focused experiments: the level each LEVELLED arm ran at, a focused arm's own
    checks, then Pass@64 of the first arm minus the second's, each verdict with the caveat
    where either arm's checks failed."""
    pairs = [(a, b) for a, b in WITHIN if a in table and b in table]
    if not pairs:
        return []
    lines = ["", "## Focused experiments: Pass@64 at T 1, paired by seed", ""]
    for arm, (setting, _) in LEVELLED.items():
        if arm in done:
            levels = sorted({r.config[setting] for r in done[arm].values()})
            lines += [f"{arm}: {ARMS[arm][0]} with {setting} = "
                      f"{'; '.join(map(_levels, levels))} (from the kept EAD runs' realised "
                      "mean token temperatures when it ran).", ""]  # fmt: skip
    for arm in FOCUSED:
        checks = [c for c in CHECKS if c.method == arm]
        if arm in table and checks:
            lines += [f"{arm}'s checks:", "", *_checks(checks, table), ""]
    rows = []
    for a, b in pairs:
        stats = _paired(table, a, b, PRIMARY)
        caveat = CAVEAT if mechanism_failed(a, table) or mechanism_failed(b, table) else ""
        rows.append((f"{a} - {b}", stats, _sd(table, a, b), verdict(stats) + caveat))
    return lines + _primary_table(rows)


def _levels(x) -> str:
    """A level, or a level a step in a few numbers."""
    if not isinstance(x, tuple) or len(x) < 3:
        return ", ".join(f"{t:g}" for t in (x if isinstance(x, tuple) else [x]))
    return (f"a level a step for {len(x)} steps (step 1 {x[0]:g}, step {len(x) // 2} "
            f"{x[len(x) // 2 - 1]:g}, step {len(x)} {x[-1]:g}; mean {np.mean(x):.3f})")  # fmt: skip


def _figures(done: dict, folder: str) -> None:
    """Study 1's figures (learning curves, Pass@k, each method's panel) and the temperature
    frontier: Pass@16 against Pass@1 at each swept temperature, one line per arm (the mean
    over its seeds, `analysis.plot_frontier` over the eval_sweep.json files)."""
    from explore_rl import analysis

    runs = [r for seeds in done.values() for r in seeds.values()]
    lab_study._figures(runs, folder)  # labels each run with its arm
    swept = []
    for r in runs:
        with open(os.path.join(r.path, "eval_sweep.json")) as f:
            final = {k: v for k, v in json.load(f).items() if k.startswith("eval/")}
        swept.append(dataclasses.replace(r, final=final))
    fig = analysis.plot_frontier(swept)
    if fig is not None:
        fig.savefig(os.path.join(folder, "frontier.png"), dpi=110)


if __name__ == "__main__":
    main()

"""Run directories -> tables and figures: training curves with a band over seeds, Pass@k
against k, Pass@k against Pass@1 over the evaluation temperatures (`frontier`, with
`eval.temperatures`), each method's own panel, and a markdown summary (mean +- spread over
seeds).

    python -m explore_rl.analysis runs/cmp/*                       # the summary table
    python -m explore_rl.analysis runs/cmp/* --curve reward/mean   # one metric per step
    python -m explore_rl.analysis --out runs/report runs/cmp/*     # PNGs + summary.md

    from explore_rl import analysis                                 # in a notebook
    runs = analysis.load(["runs/cmp/grpo-s0", "runs/cmp/grpo-s1", "runs/cmp/ead-s0"])
    analysis.summary(runs)                                          # a DataFrame
    analysis.plot_curves(runs, ["reward/mean", "rollout/entropy"])  # a Figure

A run's held-out result is its final evaluation: a `--mode eval` written into its own
folder (eval.json, e.g. more samples than during training), else its last evaluation during
training. Intervals (`bootstrap_interval`, `paired`) are percentile bootstraps over seeds;
against a baseline they resample paired differences (the same seed of both); `t_interval`
is Student's t interval, which `paired` takes in the bootstrap's place. Planning a
comparison: `detectable(sd, n)` is the smallest effect n paired seeds detect at 80% power
(paired t-test, level 0.05) when the paired differences have standard deviation sd, and
`seeds_for(effect, sd)` the seeds an effect needs.

Runs are grouped by their resolved `config.json`, not their folder names: a run's label is
its exploration methods ("grpo" when none) followed by every config field that differs
between the runs given and is not the seed (e.g. "grpo rollout.temperature=1.2"; a field
missing from some runs' config.json, added to the code after they ran, does not count);
runs with the same label are seeds of one configuration. The spread is the sample standard
deviation over seeds (0 with one seed); every table says how many seeds it averages, and a
cell is empty unless every seed has the metric, and shows each seed's value after the
mean. Training columns average each seed's last `window` logged steps (`first`: its first
`window`; `all`: every step); a curve's band at a step uses the seeds that logged that step;
seeds that end at different steps (a run still going, or stopped) are reported with a
warning.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import re
import warnings

import numpy as np
import pandas as pd
import scipy.stats
from matplotlib import colormaps, cycler
from matplotlib.figure import Figure  # no pyplot: no backend, no window; notebooks show it

from explore_rl.evaluation.metrics import SWEEP
from explore_rl.logs import flatten, read_metrics
from explore_rl.spec import SCHEDULING

CURVES = ("reward/mean", "groups/zero_adv_frac", "rollout/entropy", "rollout/response_len")
# (metric, steps) of the summary, besides the last evaluation's held-out metrics: the mean
# over each seed's first or last `window` logged steps, or over all of them
SUMMARY = (
    ("reward/mean", "first"), ("reward/mean", "last"),
    ("groups/zero_adv_frac", "first"), ("groups/zero_adv_frac", "last"),
    ("rollout/entropy", "last"), ("rollout/answer_disagreement", "last"),
    ("policy/clip_frac_low", "all"), ("policy/clip_frac_high", "all"),
)  # fmt: skip
WINDOW = 3
# method -> the metrics of its panel (prefix matches, e.g. every ASE route's reward)
PANELS = {
    "ead": ("rollout/temperature", "tis/mean", "policy/kl_mu_old"),
    "eden": ("eden/reward_noisy", "eden/reward_clean", "eden/kept_frac", "eden/clean_"),
    "ase": ("ase/alignment", "ase/inter_cosine", "ase/share_", "ase/route"),
    "extra": ("extra/queue", "extra/novelty_mean", "extra/guided_", "extra/hard", "extra/mte_"),
}
# fields that do not make two training configurations differ: the seed, evaluation
# settings, logging and checkpoint cadence, worker counts, the mesh, the memory estimate
# and how rollouts and updates are scheduled (`spec.SCHEDULING`)
IGNORED = re.compile(
    r"^(seed|eval\.|train\.(log_every|checkpoint_every|keep_checkpoints|prune_checkpoints"
    r"|samples_to_log|check_memory)|reward\.(workers|timeout)|mesh\.|memory\.)"
)


def ignored(key: str) -> bool:
    """Whether the flattened setting `key` leaves a run's configuration what it is."""
    return bool(IGNORED.match(key)) or key in SCHEDULING


@dataclasses.dataclass
class Run:
    """One run directory: its resolved config, its metrics, its configuration's label."""

    path: str
    config: dict  # the resolved config, flattened ("rollout.temperature": 1.2)
    metrics: pd.DataFrame  # one row per logged step, indexed by step
    label: str = ""
    final: dict = dataclasses.field(default_factory=dict)  # eval.json's metrics, if any

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.config.get("exploration.methods", ()))

    def __contains__(self, key: str) -> bool:
        return key in self.metrics

    def last_eval(self) -> dict[str, float]:
        """The held-out result: eval.json's when the run has one, else the last evaluation
        during training."""
        if self.final:
            return dict(self.final)
        evals = self.metrics.filter(regex="^eval/").dropna(how="all")
        return {} if evals.empty else evals.iloc[-1].dropna().to_dict()


def load_run(path: str) -> Run:
    """One run directory (config.json, metrics.jsonl, or metrics.jsonl.gz where its log was
    archived: results/lab/runs); a one-line error when it is not."""
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise ValueError(f"{path}: not a run directory (no config.json)")
    with open(config_path) as f:
        config = flatten(json.load(f))
    rows = []
    if os.path.exists(os.path.join(path, "metrics.jsonl")):
        rows = read_metrics(path)
    elif os.path.exists(os.path.join(path, "metrics.jsonl.gz")):
        with gzip.open(os.path.join(path, "metrics.jsonl.gz"), "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no metrics.jsonl lines (the run logged no step)")
    final = {}
    if os.path.exists(os.path.join(path, "eval.json")):  # `--mode eval` in the run's folder
        with open(os.path.join(path, "eval.json")) as f:
            final = {k: v for k, v in json.load(f).items() if k.startswith("eval/")}
    return Run(path, config, pd.DataFrame(rows).set_index("step").sort_index(), final=final)


def load(paths: list[str]) -> list[Run]:
    """The runs, each labelled by its configuration (see the module docstring)."""
    runs = [load_run(p) for p in paths]
    by_methods: dict[tuple, list[Run]] = {}
    for r in runs:
        by_methods.setdefault(r.methods, []).append(r)
    for methods, same in by_methods.items():  # fields that differ among one method's runs
        keys = sorted(k for k in {k for r in same for k in r.config} if not ignored(k))
        # a field only some configs have was added to the code after the others ran: it
        # separates runs only where the runs that have it disagree
        differ = [k for k in keys if len({repr(r.config[k]) for r in same if k in r.config}) > 1]
        for r in same:
            changed = [f"{k}={_value(r.config.get(k))}" for k in differ]
            r.label = " ".join(["+".join(methods) or "grpo", *changed])
    return runs


def _value(v) -> str:
    return "+".join(map(str, v)) if isinstance(v, tuple) else str(v)


def groups(runs: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: (r.label, r.seed)):
        out.setdefault(r.label, []).append(r)
    return out


def finite(x) -> bool:
    """A value that counts: not missing, not NaN or infinite."""
    return x is not None and bool(np.isfinite(x))


def _mean_sd(values: list[float]) -> tuple[float, float, int]:
    v = np.asarray([x for x in values if finite(x)], float)
    if not len(v):
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def bootstrap_interval(
    values, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` (one per seed) and its percentile bootstrap
    interval at `level` (Efron & Tibshirani 1993, ch. 13: resample the values with
    replacement, take the quantiles of the resamples' means). Of paired differences (an
    arm's seed minus the baseline's same seed) it is the paired bootstrap. NaN with none."""
    v = np.asarray([x for x in values if finite(x)], float)
    if not len(v):
        return float("nan"), float("nan"), float("nan")
    means = v[np.random.default_rng(seed).integers(0, len(v), (resamples, len(v)))].mean(1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(v.mean()), float(low), float(high)


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` (one per seed) and its Student t interval at
    `level`, mean -+ t_{(1 + level)/2, n-1} sd / sqrt(n); of paired differences, the paired
    t interval. The interval NaN under 2 values, all NaN with none."""
    mean, sd, n = _mean_sd(values)
    if n < 2:
        return mean, float("nan"), float("nan")
    half = float(scipy.stats.t.ppf((1 + level) / 2, n - 1) * sd / np.sqrt(n))
    return mean, mean - half, mean + half


def differences(arm: dict[int, float], baseline: dict[int, float]) -> dict[int, float]:
    """Arm minus baseline on each seed both have a finite value for (`{seed: value}`)."""
    seeds = sorted(s for s in set(arm) & set(baseline) if finite(arm[s]) and finite(baseline[s]))
    return {s: arm[s] - baseline[s] for s in seeds}


def paired(arm: dict[int, float], baseline: dict[int, float], interval=None, **kwargs):
    """(mean, low, high, n) of arm minus baseline over the seeds both have (`{seed: value}`),
    the interval `interval`'s of the differences (default: a paired bootstrap's,
    `bootstrap_interval`; `t_interval`: the paired t)."""
    d = differences(arm, baseline)
    return (*(interval or bootstrap_interval)(list(d.values()), **kwargs), len(d))


def verdict(stats, direction: str, threshold: float = 0.0) -> str:
    """A prediction that a quantity is above (">") or below ("<") `threshold`, judged by
    its interval `stats` = (mean, low, high, ...): "held" when the interval lies on the
    predicted side, "against" when on the other, "not resolved" when it contains the
    threshold; "not measured" without values."""
    _, low, high = stats[:3]
    if not np.isfinite(low):
        return "not measured"
    above, below = low > threshold, high < threshold
    held, against = (above, below) if direction == ">" else (below, above)
    return "held" if held else "against" if against else "not resolved"


def detectable(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest mean effect a two-sided paired t-test at level `alpha` detects with
    probability `power` from `n` paired seeds whose differences have standard deviation
    `sd`: (t_{1 - alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n), the normal-theory
    sample-size formula with t quantiles (the exact answer, from the noncentral t, is 0.3%
    larger at n = 8)."""
    if not (sd >= 0 and n >= 2 and 0 < power < 1 and 0 < alpha < 1):
        raise ValueError(
            f"detectable(sd={sd}, n={n}, power={power}, alpha={alpha}): need sd >= 0, "
            "n >= 2 paired seeds, power and alpha in (0, 1)"
        )
    df = n - 1
    return float(
        (scipy.stats.t.ppf(1 - alpha / 2, df) + scipy.stats.t.ppf(power, df)) * sd / np.sqrt(n)
    )


def seeds_for(effect: float, sd: float, power: float = 0.8, alpha: float = 0.05) -> int:
    """The fewest paired seeds at which `effect` is `detectable` (paired differences of
    standard deviation `sd`)."""
    if not (effect > 0 and sd >= 0):
        raise ValueError(f"seeds_for(effect={effect}, sd={sd}): need effect > 0 and sd >= 0")
    # the normal quantiles are below the t ones: the normal answer is a lower bound
    z = scipy.stats.norm.ppf(1 - alpha / 2) + scipy.stats.norm.ppf(power)
    n = max(2, int((z * sd / effect) ** 2))
    while detectable(sd, n, power, alpha) > effect:
        n += 1
    return n


def _column(key: str, steps: str) -> str:
    """A summary column's name: the metric for the last window, else `metric first|all`."""
    return key if steps == "last" else f"{key} {steps}"


def _training(run: Run, key: str, steps: str, window: int) -> float | None:
    if key not in run:
        return None
    series = run.metrics[key].dropna()
    return series.head(window).mean() if steps == "first" else (
        series.tail(window).mean() if steps == "last" else series.mean()
    )  # fmt: skip


def summary(runs: list[Run], window: int = WINDOW) -> pd.DataFrame:
    """Per configuration: the mean, sd and per-seed values (`<column> each`, in seed order)
    of the SUMMARY training metrics and of the last evaluation's Mean@n / Pass@k (the k the
    runs have)."""
    rows = []
    evals = {k for r in runs for k in r.last_eval() if k.startswith("eval/average/")}
    evals = {k for k in evals if not k.endswith("/temperature")}  # a sweep's, not a metric
    ks = [int(k.rsplit("@", 1)[1]) for k in evals if "/pass@" in k]
    keep = {"pass@1", f"pass@{max(ks, default=1)}"}  # Pass@k of every k: plot_pass_at_k
    evals = sorted(
        (k for k in evals if "/pass@" not in k or k.rsplit("/", 1)[1] in keep), key=_k_order
    )
    for label, members in groups(runs).items():
        ends = sorted({int(r.metrics.index.max()) for r in members})
        if len(ends) > 1:
            warnings.warn(f"{label}: its seeds end at different steps {ends}", stacklevel=2)
        row = {"config": label, "seeds": len(members)}
        cells = {_column(k, s): [_training(r, k, s, window) for r in members] for k, s in SUMMARY}
        cells.update({k: [r.last_eval().get(k) for r in members] for k in evals})
        for column, values in cells.items():
            row[column], row[f"{column} sd"], n = _mean_sd(values)
            row[f"{column} each"] = tuple(values)
            if n < len(members):
                row[column] = row[f"{column} sd"] = float("nan")  # not every seed has it
        rows.append(row)
    return pd.DataFrame(rows).set_index("config")


def _k_order(key: str):
    name = key.rsplit("/", 1)[1]
    m = re.match(r"(\D+)@(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def summary_markdown(table: pd.DataFrame) -> str:
    """One row per configuration, `mean ± sd (each seed's value)` per metric; empty where a
    seed lacks it."""
    metrics = [c for c in table.columns if c != "seeds" and not c.endswith((" sd", " each"))]
    metrics = [m for m in metrics if table[m].notna().any()]
    lines = [
        "| config | seeds | " + " | ".join(metrics) + " |",
        "|---|---|" + "---|" * len(metrics),
    ]
    for label, row in table.iterrows():
        cells = []
        for m in metrics:
            if np.isnan(row[m]):  # some seed lacks it
                cells.append("")
                continue
            each = "/".join(f"{v:.2f}" for v in row[f"{m} each"])
            cells.append(
                f"{row[m]:.3f} ± {row[f'{m} sd']:.3f}" + (f" ({each})" * (row["seeds"] > 1))
            )
        lines.append(f"| {label} | {int(row['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve(runs: list[Run], key: str) -> str:
    """`key` per logged step, the mean over each configuration's seeds that logged it: one
    markdown row per configuration."""
    table = {
        label: pd.concat([r.metrics[key].dropna() for r in members if key in r], axis=1)
        for label, members in groups(runs).items()
        if any(key in r for r in members)
    }
    if not table:
        raise ValueError(f"no run logged {key!r}")
    steps = sorted({int(s) for t in table.values() for s in t.index})
    lines = [f"| {key} \\ step | " + " | ".join(map(str, steps)) + " |"]
    lines.append("|---|" + "---|" * len(steps))
    for label, t in table.items():
        means = t.mean(axis=1).reindex(steps)
        lines.append(f"| {label} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines)


# a configuration's style, its own for up to 20 configurations (the lab study has 14 arms):
# tab20's 10 dark colours solid, then its 10 light ones dashed (and squares, marked)
_TAB20 = colormaps["tab20"].colors
STYLES = cycler(color=_TAB20[0::2] + _TAB20[1::2], linestyle=["-"] * 10 + ["--"] * 10)
POINTS = STYLES + cycler(marker=["o"] * 10 + ["s"] * 10)


def _band(ax, members: list[Run], key: str, label: str, smooth: int = 1):
    """The mean over seeds, +- one sd, at the steps every seed logged (a sparse metric,
    e.g. an evaluation, averages the same seeds at each point), in step order; each seed's
    values first a moving average over `smooth` logged points."""
    series = [r.metrics[key].dropna() for r in members if key in r.metrics]
    series = [s for s in series if len(s)]
    if not series:
        return False
    table = pd.concat(series, axis=1).sort_index().dropna()
    if table.empty:
        return False
    table = table.rolling(smooth, min_periods=1).mean()
    mean = table.mean(axis=1)
    (line,) = ax.plot(mean.index, mean.values, label=f"{label} (n={len(series)})")
    if len(series) > 1:
        sd = table.std(axis=1, ddof=1)
        ax.fill_between(mean.index, mean - sd, mean + sd, alpha=0.2, color=line.get_color())
    return True


def plot_curves(runs: list[Run], keys=CURVES, smooth: int = 1):
    """One panel per metric: the mean over seeds per configuration, +- one sd as a band
    (`smooth` > 1: of each seed's moving average over that many logged steps)."""
    fig = Figure(figsize=(4.5 * len(keys), 3.5))
    axes = fig.subplots(1, len(keys), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.set_prop_cycle(STYLES)
        for label, members in groups(runs).items():
            _band(ax, members, key, label, smooth)
        ax.set_title(key + (f" ({smooth}-step moving average)" if smooth > 1 else ""))
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_pass_at_k(runs: list[Run]):
    """Held-out Pass@k against k (log scale) at each run's final evaluation, per
    configuration: the mean over seeds and its 95% bootstrap interval, at the k every seed
    has."""
    fig = Figure(figsize=(6.5, 3.5))
    ax = fig.subplots()
    for (label, members), style in zip(groups(runs).items(), POINTS()):
        evals = [r.last_eval() for r in members]
        ks = sorted({int(k.rsplit("@", 1)[1]) for e in evals for k in e if "/average/pass@" in k})
        ks = [k for k in ks if all(f"eval/average/pass@{k}" in e for e in evals)]
        if not ks:
            continue
        stats = np.array(
            [bootstrap_interval([e[f"eval/average/pass@{k}"] for e in evals]) for k in ks]
        )
        ax.errorbar(
            ks,
            stats[:, 0],
            yerr=[stats[:, 0] - stats[:, 1], stats[:, 2] - stats[:, 0]],
            markersize=3,
            label=f"{label} (n={len(members)})",
            **style,  # errorbar takes no line style from the axes' cycle
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("Pass@k (held out)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return fig


def frontier(evals: dict | list[dict], benchmark: str = "average") -> pd.DataFrame:
    """The Pass@1 to Pass@k frontier over `eval.temperatures`: one row per swept
    temperature's label that every record has (an evaluation's metrics: eval.json's, a
    logged evaluation's, `Run.last_eval`; several, e.g. one configuration's seeds: their
    mean), its `temperature` and `pass@<k>` for each k every record and label has, in
    temperature order. Empty when no record swept a temperature."""
    evals = [evals] if isinstance(evals, dict) else list(evals)
    prefix = f"eval/{benchmark}/{SWEEP}"
    pattern = re.compile(re.escape(prefix) + r"(.+)/(temperature|pass@\d+)$")
    found = [{m.groups(): v for k, v in e.items() if (m := pattern.match(k))} for e in evals]
    common = set.intersection(*(set(f) for f in found)) if found else set()
    labels = sorted({label for label, c in common if c == "temperature"})
    every = {c for _, c in common if all((label, c) in common for label in labels)}
    columns = ["temperature", *sorted(every - {"temperature"}, key=lambda c: int(c[5:]))]
    table = pd.DataFrame(
        [[np.mean([f[label, c] for f in found]) for c in columns] for label in labels],
        index=pd.Index(labels, name="label"),
        columns=columns,
    )
    return table.sort_values("temperature", kind="stable") if labels else pd.DataFrame()


def plot_frontier(runs: list[Run], k: int | None = None, benchmark: str = "average"):
    """Held-out Pass@k against Pass@1 at each temperature of `eval.temperatures` (each
    run's final evaluation; the mean over a configuration's seeds, `frontier`), one line
    per configuration through its temperatures in order, each point labelled with its
    temperature; k: the largest every configuration has unless given. None when no run
    swept a temperature."""
    configurations = groups(runs)
    tables = {label: frontier([r.last_eval() for r in members], benchmark)
              for label, members in configurations.items()}  # fmt: skip
    tables = {label: t for label, t in tables.items() if not t.empty}
    if not tables:
        return None
    ks = set.intersection(*({int(c[5:]) for c in t.columns[1:]} for t in tables.values()))
    k = k or max(ks)
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    for (label, table), style in zip(tables.items(), POINTS()):
        n = len(configurations[label])
        ax.plot(table["pass@1"], table[f"pass@{k}"], label=f"{label} (n={n})", **style)
        for name, row in table.iterrows():
            text = f"T={row['temperature']:g}" + (f" ({name})" if name == "rollout" else "")
            ax.annotate(text, (row["pass@1"], row[f"pass@{k}"]), fontsize=6)
    ax.set_xlabel(f"Pass@1 ({benchmark}, held out)")
    ax.set_ylabel(f"Pass@{k}")
    ax.set_title("one point per evaluation temperature (eval.temperatures)", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return fig


def plot_method(runs: list[Run], method: str):
    """The method's own panel (PANELS) over its runs; None when no run uses it."""
    mine = [r for r in runs if method in r.methods]
    columns = sorted({c for r in mine for c in r.metrics.columns})
    keys = [c for prefix in PANELS[method] for c in columns if c.startswith(prefix)]
    if not keys:
        return None
    fig = Figure(figsize=(3.5 * len(keys), 3))
    axes = fig.subplots(1, len(keys), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.set_prop_cycle(STYLES)
        for label, members in groups(mine).items():
            _band(ax, members, key, label)
        ax.set_title(key, fontsize=8)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def report(paths: list[str], out: str, window: int = WINDOW) -> str:
    """Figures (curves.png, pass_at_k.png, frontier.png where the runs swept temperatures,
    <method>.png) and summary.md in `out`; returns the summary's markdown."""
    runs = load(paths)
    os.makedirs(out, exist_ok=True)
    figures = {"curves": plot_curves(runs), "pass_at_k": plot_pass_at_k(runs)}
    figures["frontier"] = plot_frontier(runs)
    figures.update({m: plot_method(runs, m) for m in PANELS})
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(os.path.join(out, f"{name}.png"), dpi=110)
    names = sorted(os.path.basename(p.rstrip("/")) for p in paths)
    text = (
        f"Runs: {len(runs)} ({', '.join(names)}).\n"
        f"Training columns: the mean of the last {window} steps (`first`: the first {window}; "
        "`all`: every step); eval columns: the last evaluation. Each cell: mean ± sample sd "
        "over seeds (each seed's value).\n\n" + summary_markdown(summary(runs, window))
    )
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text + "\n")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories")
    parser.add_argument("--out", help="write the figures and summary.md to this folder")
    parser.add_argument("--curve", help="print this metric per step instead of the summary")
    parser.add_argument("--window", type=int, default=WINDOW, help="steps averaged at each end")
    args = parser.parse_args(argv)
    try:
        if args.curve:
            print(curve(load(args.runs), args.curve))
        elif args.out:
            print(report(args.runs, args.out, args.window))
        else:
            print(summary_markdown(summary(load(args.runs), args.window)))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()

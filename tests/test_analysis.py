"""explore_rl.analysis on synthetic run directories: labels from the resolved configs,
mean and spread over seeds by hand, figures written, the Pass@k the runs have."""

import json
import os

import numpy as np
import pytest

from explore_rl import analysis


def _run(root, name, seed, temperature, methods, rewards, passes, extra=None):
    path = root / name
    os.makedirs(path)
    config = {
        "seed": seed,
        "rollout": {"temperature": temperature},
        "exploration": {"methods": methods},
        "eval": {"samples": len(passes)},
    }
    (path / "config.json").write_text(json.dumps(config))
    rows = [
        {"step": i + 1, "reward/mean": r, "rollout/entropy": 1.0 - 0.1 * i}
        for i, r in enumerate(rewards)
    ]
    for k, p in enumerate(passes, 1):
        rows[-1][f"eval/average/pass@{k}"] = p
    for r in rows:
        r.update(extra or {})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    return [
        _run(tmp_path, "a", 0, 1.0, [], [0.1, 0.2, 0.3, 0.4], [0.5, 0.7]),
        _run(tmp_path, "b", 1, 1.0, [], [0.3, 0.2, 0.5, 0.6], [0.6, 0.8]),
        _run(tmp_path, "c", 0, 1.2, [], [0.0, 0.1, 0.1, 0.2], [0.4, 0.6]),
        _run(
            tmp_path,
            "d",
            0,
            1.0,
            ["ead"],
            [0.2, 0.2, 0.2, 0.2],
            [0.5, 0.5, 0.6, 0.9],
            {"rollout/temperature": 0.8, "tis/mean": 1.0},
        ),
    ]


def test_labels_come_from_the_configs_and_seeds_are_grouped(runs):
    loaded = analysis.load(runs)
    assert [r.label for r in loaded] == [
        "grpo rollout.temperature=1.0",
        "grpo rollout.temperature=1.0",
        "grpo rollout.temperature=1.2",
        "ead",
    ]
    assert [len(v) for v in analysis.groups(loaded).values()] == [1, 2, 1]
    config = json.loads(open(os.path.join(runs[1], "config.json")).read())
    config["logging"] = {"wandb": False}  # a field added to the code after run a ran
    open(os.path.join(runs[1], "config.json"), "w").write(json.dumps(config))
    assert analysis.load(runs)[1].label == "grpo rollout.temperature=1.0"


def test_how_a_run_was_scheduled_does_not_split_its_configuration(runs):
    """Two seeds of one configuration, one run with fewer decode slots, a narrower decode
    window, micro-batches and remat (a resume that needed less memory), stay one group;
    a setting that changes what trains (the group size) splits them."""

    def change(path, **sections):
        config = json.loads(open(os.path.join(path, "config.json")).read())
        for section, values in sections.items():
            config.setdefault(section, {}).update(values)
        open(os.path.join(path, "config.json"), "w").write(json.dumps(config))

    change(runs[1], rollout={"slots": 8, "decode_window": 64}, model={"remat": "full"},
           optim={"micro_batches": 4})  # fmt: skip
    assert analysis.load(runs)[0].label == analysis.load(runs)[1].label
    change(runs[0], rollout={"group_size": 8})
    change(runs[1], rollout={"group_size": 4})
    a, b = analysis.load(runs)[:2]
    assert (a.label, b.label) == (
        "grpo rollout.group_size=8 rollout.temperature=1.0",
        "grpo rollout.group_size=4 rollout.temperature=1.0",
    )


def test_summary_means_and_spreads_by_hand(runs):
    table = analysis.summary(analysis.load(runs), window=2)
    row = table.loc["grpo rollout.temperature=1.0"]
    assert row["seeds"] == 2
    a, b = np.mean([0.3, 0.4]), np.mean([0.5, 0.6])  # the last 2 steps of each seed
    assert row["reward/mean"] == pytest.approx((a + b) / 2)
    assert row["reward/mean sd"] == pytest.approx(np.std([a, b], ddof=1))
    assert row["eval/average/pass@1"] == pytest.approx(0.55)
    assert row["eval/average/pass@1 sd"] == pytest.approx(np.std([0.5, 0.6], ddof=1))
    # Pass@1 and the largest k any run has; grpo has no Pass@4: empty, not NaN
    assert "eval/average/pass@4" in table and "eval/average/pass@2" not in table
    text = analysis.summary_markdown(table)
    grpo = next(
        line for line in text.splitlines() if line.startswith("| grpo rollout.temperature=1.0")
    )
    assert "0.550 ± 0.071" in grpo and "nan" not in text
    assert grpo.endswith("|  |")  # no Pass@4 for these runs


def test_first_last_and_each_seed_and_the_curve_by_hand(runs, capsys):
    table = analysis.summary(analysis.load(runs), window=2)
    row = table.loc["grpo rollout.temperature=1.0"]
    first = [np.mean([0.1, 0.2]), np.mean([0.3, 0.2])]  # each seed's first 2 steps
    assert row["reward/mean first"] == pytest.approx(np.mean(first))
    assert row["reward/mean first each"] == pytest.approx(tuple(first))
    assert row["rollout/entropy"] == pytest.approx(np.mean([0.8, 0.7]))  # both seeds alike
    assert np.isnan(row["policy/clip_frac_low all"])  # no run logged it
    line = next(
        x
        for x in analysis.summary_markdown(table).splitlines()
        if x.startswith("| grpo rollout.temperature=1.0")
    )
    assert "| 0.200 ± 0.071 (0.15/0.25) |" in line
    analysis.main([*runs, "--curve", "reward/mean"])
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "| reward/mean \\ step | 1 | 2 | 3 | 4 |"
    assert "| grpo rollout.temperature=1.0 | 0.20 | 0.20 | 0.40 | 0.50 |" in rows
    analysis.main(runs)  # no --out: the summary alone
    assert "| config | seeds | reward/mean first | reward/mean |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: no run logged 'tis/max'"):
        analysis.main([*runs, "--curve", "tis/max"])


def test_report_writes_figures_and_a_summary(runs, tmp_path):
    text = analysis.report(runs, str(tmp_path / "out"))
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == ["curves.png", "ead.png", "pass_at_k.png", "summary.md"]  # no EDEN run
    assert all(os.path.getsize(tmp_path / "out" / n) > 1000 for n in names if n.endswith(".png"))
    assert (tmp_path / "out" / "summary.md").read_text().strip() == text.strip()
    with pytest.raises(SystemExit, match="error: .*not a run directory"):
        analysis.main([str(tmp_path), "--out", str(tmp_path / "x")])


def test_the_bootstrap_interval_is_the_normal_one_for_many_seeds_and_degenerate_for_one():
    x = np.random.default_rng(0).standard_normal(400)
    mean, low, high = analysis.bootstrap_interval(x)
    half = 1.96 * x.std(ddof=1) / np.sqrt(len(x))  # the normal interval's half-width
    assert mean == pytest.approx(x.mean())
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert low < mean < high and (mean - low) == pytest.approx(high - mean, rel=0.25)
    assert analysis.bootstrap_interval([0.3]) == pytest.approx((0.3, 0.3, 0.3))
    assert all(np.isnan(analysis.bootstrap_interval([None, float("nan")])))


def test_pairing_by_seed_removes_the_spread_between_seeds():
    """Each seed's arm is its baseline + 0.05 while the seeds differ by up to 0.7: the paired
    interval is the shift exactly, the arms' own intervals overlap."""
    base = {s: 0.1 * s for s in range(8)}
    arm = {s: v + 0.05 for s, v in base.items()}
    arm[9] = 5.0  # a seed the baseline lacks counts in neither
    assert analysis.paired(arm, base) == pytest.approx((0.05, 0.05, 0.05, 8))
    assert analysis.paired({**arm, 0: float("nan")}, base)[3] == 7  # nor one without a value
    _, low, _ = analysis.bootstrap_interval([arm[s] for s in range(8)])
    _, _, high = analysis.bootstrap_interval(list(base.values()))
    assert low < high  # unpaired: the two intervals overlap, the difference is not resolved
    assert analysis.verdict(analysis.paired(arm, base), ">") == "held"
    assert analysis.verdict(analysis.paired(base, arm), ">") == "against"


@pytest.mark.parametrize(
    "stats, direction, threshold, expected",
    [
        ((0.1, 0.02, 0.2), ">", 0.0, "held"),
        ((0.1, -0.02, 0.2), ">", 0.0, "not resolved"),
        ((-0.1, -0.2, -0.02), ">", 0.0, "against"),
        ((-0.1, -0.2, -0.02), "<", 0.0, "held"),
        ((0.03, 0.01, 0.04), "<", 0.05, "held"),  # e.g. |TIS - 1| below 0.05
        ((-0.005, -0.009, 0.0), ">", -0.01, "held"),  # "at least": above -0.01
        ((float("nan"),) * 3, ">", 0.0, "not measured"),
    ],
)
def test_a_prediction_is_judged_by_where_its_interval_lies(stats, direction, threshold, expected):
    assert analysis.verdict(stats, direction, threshold) == expected


def test_the_smallest_detectable_effect_and_the_seeds_an_effect_needs_by_hand():
    # t quantiles from a table: t_{0.975, 7} = 2.364624, t_{0.8, 7} = 0.896030
    assert analysis.detectable(0.0118, 8) == pytest.approx(
        (2.364624 + 0.896030) * 0.0118 / 8**0.5, rel=1e-5
    )  # 0.0136
    # 12 seeds detect (2.200985 + 0.875539) x 0.0118 / sqrt(12) = 0.01048 > 0.01;
    # 13 detect (2.178813 + 0.872609) x 0.0118 / sqrt(13) = 0.00999
    assert analysis.seeds_for(0.01, 0.0118) == 13
    assert analysis.seeds_for(0.0137, 0.0118) == 8 and analysis.seeds_for(0.0136, 0.0118) == 9
    assert analysis.seeds_for(0.01, 0.0) == 2
    with pytest.raises(ValueError, match="n >= 2 paired seeds"):
        analysis.detectable(0.0118, 1)
    with pytest.raises(ValueError, match="need effect > 0"):
        analysis.seeds_for(0.0, 0.0118)


def test_a_paired_t_test_detects_the_detectable_effect_four_times_in_five():
    # 20,000 studies of 8 paired seeds whose differences are N(effect, 0.0118): the
    # two-sided t-test at 0.05 rejects at the planned power (the formula's effect is 0.3%
    # below the exact one: 0.797)
    effect = analysis.detectable(0.0118, 8)
    d = np.random.default_rng(0).normal(effect, 0.0118, (20_000, 8))
    t = d.mean(1) / (d.std(1, ddof=1) / 8**0.5)
    assert np.mean(np.abs(t) > 2.364624) == pytest.approx(0.8, abs=0.01)


def test_a_final_evaluation_in_the_run_folder_is_its_held_out_result(runs):
    """`--mode eval` written into a run's folder (eval.json) replaces the last evaluation
    during training: the summary and Pass@k read it."""
    final = {"step": 4, "eval/average/pass@1": 0.9, "eval/average/pass@64": 1.0}
    with open(os.path.join(runs[0], "eval.json"), "w") as f:
        json.dump(final, f)
    loaded = analysis.load(runs)
    assert loaded[0].last_eval() == {"eval/average/pass@1": 0.9, "eval/average/pass@64": 1.0}
    assert loaded[1].last_eval()["eval/average/pass@1"] == 0.6  # no eval.json: training's
    row = analysis.summary(loaded).loc["grpo rollout.temperature=1.0"]
    assert row["eval/average/pass@1"] == pytest.approx((0.9 + 0.6) / 2)


def test_a_curve_is_the_mean_of_each_seeds_moving_average(runs):
    fig = analysis.plot_curves(analysis.load(runs[:2]), ["reward/mean"], smooth=2)
    (line,) = fig.axes[0].lines
    # seed a: 0.1 0.2 0.3 0.4 -> 0.1 0.15 0.25 0.35; seed b: 0.3 0.2 0.5 0.6 -> 0.3 0.25 0.35 0.55
    np.testing.assert_allclose(line.get_ydata(), [0.2, 0.2, 0.3, 0.45])
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3, 4])


def test_a_run_archived_with_its_log_compressed_loads_as_the_run(runs, tmp_path):
    """results/lab/runs keeps each finished run's metrics.jsonl gzipped."""
    import gzip
    import shutil

    archived = tmp_path / "archived"
    shutil.copytree(runs[3], archived)
    with (
        open(archived / "metrics.jsonl", "rb") as f,
        gzip.open(archived / "metrics.jsonl.gz", "wb") as g,
    ):
        shutil.copyfileobj(f, g)
    os.remove(archived / "metrics.jsonl")
    original, copy = analysis.load([runs[3], str(archived)])
    assert copy.metrics.equals(original.metrics) and copy.label == original.label == "ead"
    assert copy.last_eval()["eval/average/pass@4"] == 0.9

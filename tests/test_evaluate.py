"""The held-out evaluation's sweep of temperatures (`eval.temperatures`), its fixed-count
diversity and a task's distinct solutions, on the smoke model and on hand-made responses."""

import dataclasses
import math
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from explore_rl import analysis, testing
from explore_rl import config as config_lib
from explore_rl.data import countdown
from explore_rl.evaluation import evaluate, metrics

N = 4  # samples per question


def _config(temperatures: str = "", rollout_temperature: float = 1.0):
    c = testing.smoke()
    c.eval.samples, c.eval.num_prompts, c.eval.batch_prompts = N, 4, 2
    c.eval.max_new_tokens, c.eval.temperature = 6, 1.0
    c.eval.temperatures, c.rollout.temperature = temperatures, rollout_temperature
    return c


@pytest.fixture(scope="module")
def model():
    spec = config_lib.spec(_config())
    params, cfg, tok = spec.model.load(spec.seed)
    return params, cfg, tok


def _evaluate(model, c, plan_fn=None, records=None, calls=None, monkeypatch=None):
    """`evaluate` of config `c` on the smoke model; `calls`: each generation's plan
    temperatures, key and responses, appended."""
    params, cfg, tok = model
    spec = config_lib.spec(c).with_stop_ids(tok.stop_ids)
    tests, _ = evaluate.fit_held_out(spec, tok, spec.problems()[1])
    if calls is not None:
        generate = evaluate.rollout.generate

        def spy(params, cfg, tok, plan, key, verifier, **kwargs):
            r = generate(params, cfg, tok, plan, key, verifier, **kwargs)
            calls.append((np.unique(np.asarray(plan.temperature)), key, list(r.texts)))
            return r

        monkeypatch.setattr(evaluate.rollout, "generate", spy)
    with spec.reward.verifier() as verifier:
        rng = jax.random.key(0)
        return evaluate.evaluate(params, cfg, tok, tests, spec, verifier, rng, plan_fn, records)


def _todays_keys(prefix: str) -> set[str]:
    ks = range(1, N + 1)
    return {f"{prefix}/mean@{N}", f"{prefix}/maj@{N}"} | {
        f"{prefix}/{m}@{k}" for m in ("pass", "worst") for k in ks
    }


def test_a_sweep_adds_one_result_per_temperature_and_leaves_the_base_as_it_was(model):
    records = []
    base = _evaluate(model, _config(), records=records)
    # no sweep: today's keys alone, their numbers those of the responses recorded
    assert set(base) == _todays_keys("eval/arithmetic") | _todays_keys("eval/average")
    correct = np.array([r["correct"] for r in records]).reshape(-1, N)
    assert correct.shape == (4, N)
    assert base["eval/arithmetic/mean@4"] == correct.mean()
    for k, v in metrics.pass_at_ks(correct).items():
        assert base[f"eval/arithmetic/pass@{k}"] == base[f"eval/average/pass@{k}"] == v

    swept = _evaluate(model, _config("0.5, 2.0,rollout", rollout_temperature=0.7))
    assert {k: swept[k] for k in base} == base  # the base evaluation: same keys, same draws
    for label, value in (("0.5", 0.5), ("2", 2.0), ("rollout", 0.7)):
        for bench in ("arithmetic", "average"):
            prefix = f"eval/{bench}/T_{label}"
            keys = {f"{prefix}/temperature", f"{prefix}/mean@4"}
            keys |= {f"{prefix}/pass@{k}" for k in range(1, N + 1)}
            assert keys <= swept.keys()
            assert swept[f"{prefix}/temperature"] == pytest.approx(value)
            assert 0 <= swept[f"{prefix}/mean@4"] <= swept[f"{prefix}/pass@4"] <= 1
    assert len(swept) == len(base) + 3 * 2 * (2 + N)  # nothing else


def test_each_temperature_draws_its_own_keys_from_the_plain_policy(model, monkeypatch):
    """Two entries at one temperature (0.7, and `rollout` at 0.7) draw different samples;
    the explorers' test-time plan (here: doubling the temperature) edits the base
    evaluation's plans only."""
    calls = []
    c = _config("0.7,rollout", rollout_temperature=0.7)
    double = lambda plan: plan.replace(temperature=2 * plan.temperature)  # noqa: E731
    _evaluate(model, c, plan_fn=double, calls=calls, monkeypatch=monkeypatch)
    assert len(calls) == 3 * 2  # base, 0.7, rollout; two batches of two questions each
    base, first, second = calls[0:2], calls[2:4], calls[4:6]
    assert all(t.tolist() == [2.0] for t, _, _ in base)  # 1.0, doubled by the plan
    assert all(np.allclose(t, [0.7]) for t, _, _ in first + second)  # as listed, no plan
    keys = [jax.random.key_data(k).tolist() for _, k, _ in calls]
    assert len({str(k) for k in keys}) == 6  # every batch of every temperature its own key
    assert [x[2] for x in first] != [x[2] for x in second]  # other samples at one T
    rng = jax.random.key(0)  # the keys derived in one place: `sweep_key`, batch offsets in it
    for i, j in ((0, 2), (1, 4)):
        first_batch = jax.random.fold_in(evaluate.sweep_key(rng, i), 0)
        assert keys[j] == jax.random.key_data(first_batch).tolist()


@pytest.mark.parametrize(
    "setting,value,message",
    [
        ("temperatures", "0.7,hot", "eval.temperatures='0.7,hot': 'hot' must be a finite"),
        ("temperatures", "-1", "'-1' must be a finite number >= 0; or give 'rollout'"),
        ("temperatures", "1, 1.0", "'1.0' is given twice"),
        ("temperatures", "rollout,rollout", "'rollout' is given twice"),
        ("diversity_correct", 1, "eval.diversity_correct=1: must be an integer >= 2"),
    ],
)
def test_bad_evaluation_settings_are_refused_in_one_line(setting, value, message):
    c = _config()
    c.eval[setting] = value
    with pytest.raises(ValueError, match=f"^config: .*{message}"):
        config_lib.spec(c)


def test_the_fixed_count_needs_that_many_samples_when_measured():
    c = _config()
    c.eval.diversity, c.eval.diversity_correct = True, N + 1
    with pytest.raises(ValueError, match="eval.diversity_correct=5: at most eval.samples=4"):
        config_lib.spec(c)
    c.eval.diversity = False  # not measured: no count to reach
    config_lib.spec(c)


class _Orthogonal:
    """An encoder giving each distinct text its own unit axis: a set of k distinct texts
    has LogDet log det(2 I) = k log 2."""

    def __init__(self):
        self.axes = {}

    def embed(self, texts):
        z = np.zeros((len(texts), 16))
        for i, t in enumerate(texts):
            z[i, self.axes.setdefault(t, len(self.axes))] = 1.0
        return z


def test_fixed_count_diversity_and_distinct_trees_by_hand(monkeypatch):
    monkeypatch.setattr(evaluate, "_encoder", lambda: _Orthogonal())
    # "3 4 5 -> 12": three correct (two of one tree, commuted), one wrong; "2 5 6 -> 16"
    # (say): one correct of four
    texts = ["3+4=7\n7+5=12", "4+3=7\n5+7=12", "4+5=9\n3+9=12", "3*4=12",
             "no", "nope", "nah", "2*5=10\n10+6=16"]  # fmt: skip
    tokens = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9],
                       [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3], [4, 4, 4, 4]])  # fmt: skip
    correct = np.array([[True, True, True, False], [False, False, False, True]])
    r = SimpleNamespace(
        problems=["q0", "q1"], group_size=N, texts=texts, correct=correct,
        out=SimpleNamespace(tokens=tokens, mask=tokens > 0),
    )  # fmt: skip
    q0, q1 = evaluate.measures(r, m=2, solutions=countdown.solution_key)
    log2 = math.log(2)
    # its 3 correct: 4-grams (1234) twice, (5678); all 4: also (9999); first 2: (1234) twice
    assert q0["distinct4"] == 2 / 3 and q0["distinct4@4"] == 3 / 4
    assert q0["distinct4@2correct"] == 1 / 2 and q0["self_bleu@2correct"] == pytest.approx(1)
    assert q0["logdet"] == pytest.approx(3 * log2) and q0["logdet@4"] == pytest.approx(4 * log2)
    assert q0["logdet@2correct"] == pytest.approx(2 * log2)  # two texts, one tree
    assert q0["solutions@4"] == 2 and q0["solutions@2correct"] == 1
    # one correct: no set of correct ones, its solutions over all 4 counted
    assert set(q1) == {"distinct4@4", "self_bleu@4", "logdet@4", "solutions@4"}
    assert q1["distinct4@4"] == 1 and q1["solutions@4"] == 1
    drawn = evaluate.Drawn(correct, [[None] * N] * 2, [q0, q1])
    out = evaluate._benchmark_metrics("cd", drawn, N, 2)
    assert out["eval/cd/distinct4"] == 2 / 3  # q0 alone
    assert out["eval/cd/distinct4@4"] == (3 / 4 + 1) / 2  # every question
    assert out["eval/cd/distinct4@2correct"] == 1 / 2 and out["eval/cd/covered@2correct"] == 1
    assert out["eval/cd/solutions@4"] == 1.5 and out["eval/cd/solutions@2correct"] == 1
    # without a solution key (a task with one answer per question): no solutions counted
    assert not any(k.startswith("solutions") for d in evaluate.measures(r, 2) for k in d)


def test_the_lab_counts_countdown_trees():
    from explore_rl.data import tasks

    lab = config_lib.resolve(config_lib.load("configs/lab.py:smoke"))  # the preset's files
    assert lab.task.name == "jsonl" and lab.task.solutions is countdown.solution_key
    drawn = config_lib.load("configs/lab.py:smoke")
    drawn.task.name = "countdown"  # the task drawing them in code
    assert config_lib.resolve(drawn).task.solutions is countdown.solution_key
    assert config_lib.resolve(_config()).task.solutions is None is tasks.solutions_of("jsonl")


def _sweep(label: str, t: float, passes: list[float], bench: str = "average") -> dict:
    out = {f"eval/{bench}/T_{label}/temperature": t}
    out.update({f"eval/{bench}/T_{label}/pass@{k}": p for k, p in enumerate(passes, 1)})
    return out


def test_the_frontier_of_hand_made_records():
    one = {"eval/average/pass@1": 0.9, **_sweep("1.2", 1.2, [0.2, 0.5, 0.6])}
    one |= _sweep("0.7", 0.7, [0.4, 0.5, 0.5]) | _sweep("rollout", 1.2, [0.3, 0.6, 0.7])
    table = analysis.frontier(one)
    assert list(table.index) == ["0.7", "1.2", "rollout"]  # by temperature, then label
    assert list(table.columns) == ["temperature", "pass@1", "pass@2", "pass@3"]
    assert table.loc["0.7"].tolist() == [0.7, 0.4, 0.5, 0.5]
    # two seeds: their mean, at the labels and k both have
    two = _sweep("0.7", 0.7, [0.2, 0.3]) | _sweep("1", 1.0, [0.1, 0.9])
    table = analysis.frontier([one, two])
    assert list(table.index) == ["0.7"] and list(table.columns) == [
        "temperature",
        "pass@1",
        "pass@2",
    ]
    assert table.loc["0.7"].tolist() == pytest.approx([0.7, 0.3, 0.4])
    assert analysis.frontier({"eval/average/pass@1": 0.5}).empty  # no sweep
    assert analysis.frontier(one, benchmark="countdown").empty


def test_the_frontier_figure(tmp_path):
    import pandas as pd

    runs = []
    for i, (t, passes) in enumerate([(1.0, [0.2, 0.4]), (1.2, [0.3, 0.5])]):
        run = analysis.Run(
            str(tmp_path / f"r{i}"), {"seed": i, "rollout.temperature": t},
            pd.DataFrame({"reward/mean": [0.1]}, index=pd.Index([1], name="step")),
            final=_sweep("0.7", 0.7, passes) | _sweep("1.2", 1.2, passes[::-1]),
        )  # fmt: skip
        run.label = f"grpo rollout.temperature={t}"
        runs.append(run)
    fig = analysis.plot_frontier(runs)
    (ax,) = fig.axes
    assert [line.get_xydata().tolist() for line in ax.lines] == [
        [[0.2, 0.4], [0.4, 0.2]], [[0.3, 0.5], [0.5, 0.3]]
    ]  # fmt: skip
    assert analysis.plot_frontier([dataclasses.replace(runs[0], final={})]) is None

"""ExTra: the JAX MiniLM against sentence-transformers, the novelty reward, the prefix rule
and its smoothing by hand, guided prompts through the trainer (their own answers, no loss
on the prefix), resume of memories and queue, every variant's smoke run, EAD composition."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, forward, run_main, score

from configs import extra as extra_config
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.exploration import base, extra
from explore_rl.hoststate import HostState
from explore_rl.logs import read_metrics
from explore_rl.models import minilm
from explore_rl.modes import eval as eval_mode
from explore_rl.rewards.math import Verifier
from explore_rl.train import loop, steps

# the MiniLM in another batch, mu against a full forward
pytestmark = pytest.mark.numerics

SENTENCES = [
    "We add 3 and 4 to get 7, so the answer is \\boxed{7}.",
    "Adding four to three gives seven.",
    "The cat sat quietly on the warm mat.",
    "x" * 3000,  # truncated at 256 word pieces
]


GUIDED_PREFIX = "We add the two numbers:"


def prefix_and_own_answer(response, problem):
    """1 for a response that starts with the guided prefix, of a problem whose answer is
    "100" (no sum of the smoke task's 1-digit numbers is): the reward sees prefix + the
    sampled suffix, and the guided prompt's own answer."""
    return float(response.startswith(GUIDED_PREFIX) and problem.answer == "100")


@pytest.fixture(scope="module")
def encoder():
    return minilm.load()


def test_minilm_matches_sentence_transformers(encoder):
    import sentence_transformers as st  # a dev requirement: missing, this fails, not skips

    ref = st.SentenceTransformer(minilm.embedded_path(), device="cpu").encode(
        SENTENCES, normalize_embeddings=True
    )
    z = encoder.embed(SENTENCES)
    assert z.shape == (4, 384)
    assert (np.sum(z * ref, axis=1) > 0.999).all()


def test_a_sentence_transformers_folder_loads_like_the_embedded_model(tmp_path):
    import shutil

    shutil.copytree(minilm.embedded_path(), tmp_path / "st")
    folder = minilm.load(str(tmp_path / "st")).embed(SENTENCES[:2])
    # exact: the same weights through the same program on the same batch (a new encoder:
    # `encoder` may hold these texts from a batch of another size, another program)
    np.testing.assert_array_equal(folder, minilm.load().embed(SENTENCES[:2]))
    (tmp_path / "st" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="model_type='llama', need a BERT encoder"):
        minilm.load(str(tmp_path / "st"))


def test_minilm_is_stable_and_cached(encoder):
    z = encoder.embed(SENTENCES)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-5)
    again = minilm.load().embed(SENTENCES[::-1])[::-1]  # a fresh encoder, another batch
    assert_float32_close(again, z)
    assert SENTENCES[0] in encoder.cache
    sim = z @ z.T
    assert sim[0, 1] > sim[0, 2]  # the two sums are closer than the cat


def test_novelty_reward_by_hand():
    theta = 0.3
    z = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    stored = np.array([[math.cos(theta), math.sin(theta)]])
    r = extra.novelty_reward(z[:1], np.array([True]), stored)
    assert r[0] == pytest.approx(1 - math.cos(theta))  # 1 - cos of a hand-made pair
    r = extra.novelty_reward(z, np.array([True, False, True]), np.zeros((0, 2)))
    assert r[1] == 0.0  # incorrect rows get nothing
    assert r[0] == pytest.approx(0.0) and r[2] == pytest.approx(0.0)  # duplicate siblings
    dup = extra.novelty_reward(z[1:2], np.array([True]), z[1:2])
    assert dup[0] == pytest.approx(0.0)  # an exact duplicate of a stored response
    assert extra.novelty_reward(z[:1], np.array([True]), np.zeros((0, 2)))[0] == 1.0  # no Phi


def test_the_prefix_rule_on_a_hand_built_response():
    # line breaks at these token positions: merged when < 32 apart, the last dropped
    cuts = extra.select_cuts(np.array([3, 10, 40, 45, 80, 150, 200]), 32, 15)
    np.testing.assert_array_equal(cuts, [40, 80, 150])  # 3, 10: < 32 from the start
    many = extra.select_cuts(np.arange(0, 32 * 41, 32) + 31, 32, 15)  # 41 cuts -> 40 -> 15
    assert len(many) == 15 and many[0] == 31 and many[-1] == 31 + 32 * 39


def test_hard_problems_by_either_rule():
    one_of_four, none = np.array([True, False, False, False]), np.zeros(4, bool)
    assert extra.is_hard(one_of_four, "pass_rate") and extra.is_hard(none, "pass_rate")
    assert not extra.is_hard(one_of_four, "all_incorrect") and extra.is_hard(none, "all_incorrect")
    assert not extra.is_hard(np.array([True, True, False, False]), "pass_rate")  # 2/4 > 1/4


def test_smoothing_at_tau_one_tenth_by_hand():
    z = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    h = np.array([1.0, 0.2, 0.7])
    out = extra.smooth_scores(z, h, 0.1)
    for i in range(3):
        w = [math.exp((z[i] @ z[j]) / 0.1) for j in range(3)]
        assert out[i] == pytest.approx(sum(wj * hj for wj, hj in zip(w, h)) / sum(w))
    assert int(np.argmin(out)) == 1


def test_prefixes_that_embed_alike_go_to_the_lowest_entropy_not_the_oldest():
    # long prefixes MiniLM reads the same 256 word pieces of: one embedding, so every
    # smoothed score is equal, and the choice is the entry's own MTE
    z = np.tile([[0.6, 0.8]], (4, 1))
    mte = np.array([0.9, 0.7, 0.2, 0.5])
    smoothed = extra.smooth_scores(z, mte, 0.1)
    assert len(set(smoothed.tolist())) == 1
    assert extra.lowest(smoothed, mte) == 2
    assert extra.lowest(np.array([0.3, 0.1, 0.1]), np.array([0.0, 0.5, 0.4])) == 2


class LineTok:
    """Token 9 is a line break; any other id is its own text."""

    def decode(self, ids):
        return "".join("\n" if i == 9 else f"<{i}>" for i in ids)


def hard_group(tokens, entropy, max_prompt_len=64):
    """(rollouts, step context) of one all-wrong group of a 10-token prompt, as
    `ExTra.regenerate` reads them."""
    from types import SimpleNamespace

    from explore_rl.data.tasks import Problem

    ro = SimpleNamespace(
        problems=[Problem("q", "5", messages=(("user", "q"),), columns={"source": "toy"})],
        group_size=len(tokens),
        correct=np.zeros((1, len(tokens)), bool),
        out=SimpleNamespace(tokens=tokens, mask=np.ones(tokens.shape, bool), entropy=entropy),
        prompt_mask=np.ones((1, 10), bool),
    )
    rollout = SimpleNamespace(max_prompt_len=max_prompt_len)
    return ro, SimpleNamespace(tok=LineTok(), step=5, spec=SimpleNamespace(rollout=rollout))


def regenerator(**settings):
    c = extra_config.get_config("smoke")
    c.exploration.extra.update(features="ngram", **settings)
    (ex,) = base.build(config_lib.spec(c))
    return ex


def test_regeneration_pushes_the_lowest_entropy_prefix_of_the_lowest_entropy_rollout():
    from types import SimpleNamespace

    from explore_rl.data.tasks import Problem

    ex = regenerator(min_gap=2, mine="lowest")
    # row 1 has the lower mean token entropy; its line breaks (token 9) at 1, 4, 7 and 10,
    # each >= 2 after the last kept, the last (10) dropped: cuts 1, 4 and 7, whose prefixes'
    # MTEs are 0.2, 0.2 and (5 x 0.2) / 8 = 0.125: the lowest is the longest
    tokens = np.array([[1, 9, 2, 3, 9, 4, 5, 9, 1, 2, 9, 3], [6, 9, 7, 8, 9, 1, 2, 9, 3, 4, 9, 5]])
    entropy = np.array([[1.0] * 12, [0.2] * 5 + [0.0] * 3 + [0.9] * 4])
    ro, ctx = hard_group(tokens, entropy)
    fresh, prefixes, metrics = ex.regenerate({}, ro, np.zeros(2, bool), ctx)
    assert metrics["hard"] == 1 and metrics["pushed"] == 1
    # the whole problem, with the chosen prefix (its chat and row too: rewards read them),
    # as the checkpoint's JSON gives it back
    guided = Problem.from_json(json.loads(json.dumps(fresh[0])))
    assert guided == Problem("q", "5", (6, 9, 7, 8, 9, 1, 2, 9), messages=(("user", "q"),))
    assert guided.columns == {"source": "toy"}
    assert metrics["mte_chosen"] == pytest.approx(0.125)
    assert metrics["mte_random"] in (pytest.approx(0.2), pytest.approx(0.125))
    remembered = prefixes[Problem("q", "5").id]
    assert [len(p["tokens"]) for p in remembered] == [2, 5, 8]
    assert [p["mte"] for p in remembered] == pytest.approx([0.2, 0.2, 0.125])
    solved = SimpleNamespace(**{**vars(ro), "correct": np.array([[True, True]])})
    assert ex.regenerate({}, solved, np.zeros(2, bool), ctx)[0] == []
    _, tight = hard_group(tokens, entropy, max_prompt_len=12)
    fresh, _, _ = ex.regenerate({}, ro, np.zeros(2, bool), tight)  # 10 + 5 > 12: cut 1 only
    assert fresh[0]["prefix"] == [6, 9]


def test_mining_every_rollout_finds_a_prefix_the_lowest_entropy_rollout_lacks():
    # row 1's mean token entropy (0.5) is below row 0's ((5 x 0.1 + 11) / 16 = 0.72), but
    # row 0 opens calm: its first prefix (cut at 4) has MTE 0.1, row 1's prefixes 0.5.
    # Line breaks at 4, 9, 14, the last dropped: cuts 4 and 9 in each row. tau 0.001 keeps
    # the smoothing from mixing prefixes (their 4-gram cosines are < 0.6): h~ = h.
    tokens = np.array(
        [[1, 2, 3, 4, 9, 5, 6, 7, 8, 9, 1, 3, 5, 7, 9, 2],
         [11, 12, 13, 14, 9, 15, 16, 17, 18, 9, 11, 13, 15, 17, 9, 12]]
    )  # fmt: skip
    entropy = np.array([[0.1] * 5 + [1.0] * 11, [0.5] * 16])
    ro, ctx = hard_group(tokens, entropy)
    picked = {}
    for mine in ("all", "lowest"):
        ex = regenerator(min_gap=2, tau=0.001, mine=mine)
        fresh, prefixes, metrics = ex.regenerate({}, ro, np.zeros(2, bool), ctx)
        picked[mine] = (fresh[0]["prefix"], metrics["mte_chosen"], prefixes)
    prefix, mte, memory = picked["all"]
    assert prefix == [1, 2, 3, 4, 9] and mte == pytest.approx(0.1)
    (entries,) = memory.values()  # both rows' cuts: (5 x 0.1 + 5 x 1.0) / 10 = 0.55
    assert [len(e["tokens"]) for e in entries] == [5, 10, 5, 10]
    assert [e["mte"] for e in entries] == pytest.approx([0.1, 0.55, 0.5, 0.5])
    prefix, mte, memory = picked["lowest"]
    assert prefix[0] == 11 and mte == pytest.approx(0.5)  # row 1's: 0.1 was never seen
    assert [len(e["tokens"]) for e in next(iter(memory.values()))] == [5, 10]


def test_the_step_consumes_exactly_the_queue_entries_its_plan_took():
    from types import SimpleNamespace

    c = extra_config.get_config("regen,smoke")
    c.exploration.extra.warmup = 100  # no regeneration: only the queue moves
    (ex,) = base.build(config_lib.spec(c))
    queue = [{"question": f"q{i}", "answer": "1", "prefix": [1]} for i in range(3)]
    state = {
        "pushed": np.int32(0),
        "host": HostState({"correct": {}, "prefixes": {}, "queue": queue}),
    }
    from explore_rl.data.tasks import Problem

    plan = ex.plan(state, base_plan_for([Problem("a", "1"), Problem("b", "2")]), None, None)
    assert [p.question for p in plan.problems] == ["a", "q0"]  # half the groups at most
    # the guided group was dropped from the batch (e.g. by DAPO's filter): still consumed
    ro = SimpleNamespace(
        plan=SimpleNamespace(
            info={"extra": {"guided": np.zeros(4, bool), "taken": plan.info["extra"]["taken"]}}
        ),
        correct=np.zeros((2, 2), bool),
        group_size=2,
        problems=[Problem("a", "1"), Problem("c", "3")],
    )
    out = ex.shape_advantages(
        state, ro, np.zeros(4, np.float32), np.ones(4, np.float32), SimpleNamespace(step=0)
    )
    assert [e["question"] for e in out.state["host"].data["queue"]] == ["q1", "q2"]


def base_plan_for(problems):
    from explore_rl.rl.plan import base_plan

    return base_plan(2 * len(problems), 4, 1.0, problems)


def test_embeddings_pack_to_json_text_and_back():
    v = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    s = extra.pack(v)
    assert isinstance(json.loads(json.dumps(s)), str)
    # float16 (11 bits) of N(0, 1) values: its rounding of the values' known size, absolute
    np.testing.assert_allclose(extra.unpack(s), v, rtol=1e-3, atol=1e-3)


# ----------------------------------------------------------------------------- trainer


def _seed_queue(monkeypatch, entries):
    """Start runs with guided prompts already in the queue."""
    init = extra.ExTra.init

    def seeded(self, ctx):
        state = init(self, ctx)
        return {**state, "host": HostState({**state["host"].data, "queue": list(entries)})}

    monkeypatch.setattr(extra.ExTra, "init", seeded)


def _guided(tok, question, answer, prefix_text):
    return {"question": question, "answer": answer, "prefix": tok.encode(prefix_text)}


@pytest.mark.slow
def test_guided_rows_use_their_own_answer_and_carry_no_prefix_loss(monkeypatch, tmp_path):
    from explore_rl.models import weights

    tok = weights.load_tokenizer("embedded")
    queue = [_guided(tok, "What is 73 + 27?", "100", GUIDED_PREFIX)]
    _seed_queue(monkeypatch, queue)
    c = extra_config.get_config("smoke")
    c.reward.fn = "test_extra:prefix_and_own_answer"
    with Verifier(1, 5.0) as verifier:
        run, progress, _ = testing.start(c, str(tmp_path), verifier)
        ro, _, _ = steps.collect(run, progress, 0)
        batch, states, metrics = steps.make_batch(run, progress, ro, 0)
    # the last of the 2 groups is the guided prompt, rewarded against its own answer
    assert ro.problems[-1].answer == "100"
    assert ro.problems[-1].prefix == tuple(queue[0]["prefix"])
    np.testing.assert_array_equal(ro.rewards, [[0.0] * 4, [1.0] * 4])
    assert metrics["extra/guided_solve_rate"] == 1.0 and metrics["extra/queue"] == 0
    # the prefix is prompt: the update scores the response tokens only, as a full forward
    prefix = np.asarray(queue[0]["prefix"])
    row = np.asarray(ro.prompts[-1])[np.asarray(ro.prompt_mask[-1])]
    np.testing.assert_array_equal(row[-len(prefix) :], prefix)
    b = ro.rewards.size - 1
    logp, _ = score(
        progress.state.params, run.cfg, batch.prompts, batch.prompt_mask, batch.tokens, batch.mask
    )
    resp = np.asarray(batch.tokens[b])[np.asarray(batch.mask[b])]
    seq = jnp.asarray(np.concatenate([row, resp]))[None]
    full = forward(
        progress.state.params,
        run.cfg,
        seq,
        jnp.arange(seq.shape[1])[None],
        jnp.ones_like(seq, bool),
    ).logits[0]
    ref = jax.nn.log_softmax(full[len(row) - 1 : -1])[jnp.arange(len(resp)), resp]
    scale = float(jnp.abs(full[len(row) - 1 : -1]).max())  # the logits they come from
    assert_float32_close(logp[b][: len(resp)], ref, scale=scale)


@pytest.mark.slow
def test_the_bonus_enters_after_or_before_the_group_normalisation(tmp_path):
    """The same rollouts through the trainer's batch assembly: `after` (the paper) adds
    gamma r_int to GRPO's advantages; `before` (a reward) normalises it with the rewards."""
    from explore_rl.exploration import base as exploration
    from explore_rl.rl.advantages import grpo

    c = _smoke("novelty,smoke", steps=1)  # parity rewards: mixed groups, correct rows
    c.exploration.extra.features = "ngram"
    batches, ro = {}, None
    with Verifier(1, 5.0) as verifier:
        for at in ("after", "before"):
            c.exploration.extra.novelty_at = at
            run, progress, _ = testing.start(c, str(tmp_path / at), verifier)
            if ro is None:  # one set of rollouts for both
                ro = steps.collect(run, progress, 0)[0]
            batches[at], _, _ = steps.make_batch(run, progress, ro, 0)
        ctx = run.context(progress.state.params, 0)
        bonused = exploration.rewards(run.explorers, progress.explorers, ro, ro.rewards, ctx)
    bonus = (bonused - ro.rewards).reshape(-1)  # gamma r_int: the project's novelty
    correct = np.asarray(ro.correct).reshape(-1)
    assert (bonus[correct] > 0).any() and (bonus[~correct] == 0).all()
    plain = np.asarray(grpo(jnp.asarray(ro.rewards))).reshape(-1)
    np.testing.assert_allclose(batches["after"].advantages, plain + bonus, rtol=1e-6, atol=1e-6)
    normalised = np.asarray(grpo(jnp.asarray(bonused))).reshape(-1)
    np.testing.assert_allclose(batches["before"].advantages, normalised, rtol=1e-6, atol=1e-6)
    assert not np.allclose(batches["after"].advantages, batches["before"].advantages)


def _smoke(arg="smoke", steps=3):  # mixed groups: correct responses for the novelty memory
    return testing.smoke(f"configs/extra.py:{arg}", steps)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [None, "novelty", "regen"])
def test_every_variant_trains(variant, tmp_path):
    c = _smoke("smoke" if variant is None else f"{variant},smoke")
    progress = loop.train(config_lib.spec(c), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3]
    memory = progress.explorers["extra"]["host"].data["correct"]
    if variant == "regen":
        assert not memory and all("extra/novelty_mean" not in r for r in rows)
    else:
        assert memory and any("extra/novelty_mean" in r for r in rows)
        assert all(0 <= r["extra/novelty_mean"] <= 1 for r in rows if "extra/novelty_mean" in r)


@pytest.mark.slow
@pytest.mark.parametrize("features", ["ngram", "hidden"])
def test_the_other_novelty_features_train(features, tmp_path):
    c = _smoke("novelty,smoke", steps=2)
    c.exploration.extra.features = features
    progress = loop.train(config_lib.spec(c), str(tmp_path))
    stored = next(iter(progress.explorers["extra"]["host"].data["correct"].values()))
    dim = extra.NGRAM_DIM if features == "ngram" else c_model_dim(c)
    assert extra.unpack(stored[0]).shape == (dim,)
    assert any("extra/novelty_mean" in r for r in read_metrics(str(tmp_path)))


def c_model_dim(c):
    from explore_rl.models import presets

    return presets.get_preset(c.model.random_init).d_model


@pytest.mark.slow
def test_memories_and_queue_survive_an_exact_resume(monkeypatch, tmp_path):
    from explore_rl.models import weights

    tok = weights.load_tokenizer("embedded")
    entries = [_guided(tok, f"What is {i} + 1?", str(i + 1), "First,") for i in range(3)]
    _seed_queue(monkeypatch, entries)  # a guided group a step: the queue runs down over the run
    straight = loop.train(config_lib.spec(_smoke(steps=4)), str(tmp_path / "a"))
    loop.train(config_lib.spec(_smoke(steps=2)), str(tmp_path / "b"))
    resumed = loop.train(config_lib.spec(_smoke(steps=4)), str(tmp_path / "b"))
    data = straight.explorers["extra"]["host"].data
    assert data["correct"] and len(data["queue"]) == 0  # 3 guided prompts, 1 a step
    assert resumed.explorers["extra"]["host"].data == data
    # exact: a resume runs the same programs on the same shapes and restored state
    for x, y in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    rows = read_metrics(str(tmp_path / "b"))
    assert [r["extra/guided_rows"] for r in rows] == [4, 4, 4, 0]


@pytest.mark.slow
def test_extra_composes_with_ead_through_the_cli(tmp_path):
    out = run_main(
        "--config=configs/extra.py:smoke",
        f"--workdir={tmp_path}",
        "--config.exploration.methods=('extra', 'ead')",
        "--config.rl.tis_cap=2.0",  # EAD's (configs/ead.py), or the run is refused
        f"--config.reward.fn={testing.PARITY}",
        "--config.train.steps=2",
        "--config.train.eval_every=0",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(str(tmp_path))
    assert all(r["rollout/temperature"] < 1.0 for r in rows)  # EAD acts
    assert any(r.get("extra/novelty_mean", 0) > 0 for r in rows)  # ExTra's novelty acts


def test_config_errors_name_the_field():
    def resolve(**changes):
        c = extra_config.get_config("smoke")
        c.exploration.extra.update(changes)
        return config_lib.spec(c)

    for field, value, message in [
        ("features", "bleu", "features='bleu'"),
        ("tau", 0.0, "tau=0.0: must be > 0"),
        ("guided_frac", 2.0, "guided_frac=2.0"),
        ("mine", "best", r"mine='best': allowed \('all', 'lowest'\)"),
    ]:
        with pytest.raises(ValueError, match=f"config: exploration.extra.{message}"):
            resolve(**{field: value})
    with pytest.raises(ValueError, match="nothing to do"):
        resolve(novelty=False, regen=False)


def test_the_diversity_of_correct_responses_at_evaluation(encoder):
    from types import SimpleNamespace

    from explore_rl.evaluation import evaluate, metrics

    tokens = np.array(
        [[1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 6, 0], [9, 9, 9, 9, 9, 9], [7, 7, 0, 0, 0, 0]]
    )
    mask = tokens > 0
    texts = ["add them: 7", "add them, 7", "I do not know", "7"]
    r = SimpleNamespace(
        problems=["q0", "q1"],
        group_size=2,
        out=SimpleNamespace(tokens=tokens, mask=mask),
        correct=np.array([[True, True], [False, True]]),  # q1 has one correct: skipped
        texts=texts,
    )
    d, d1 = evaluate.measures(r, m=2)
    assert d["distinct4"] == 3 / 4  # (1234) twice, (2345), (2346)
    both = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]]
    assert d["self_bleu"] == pytest.approx(metrics.bleu(both[0], both[1:]))  # symmetric here
    assert d["logdet"] == pytest.approx(metrics.log_det(encoder.embed(texts[:2])), rel=1e-5)
    assert "distinct4" not in d1 and "distinct4@2correct" not in d1  # one correct of two
    assert d1["distinct4@2"] == 1 / 3  # all its responses: (9999) three times, no other


@pytest.mark.slow
def test_evaluation_reports_the_diversity_measures(tmp_path):
    from configs import grpo

    c = grpo.get_config("smoke")
    c.reward.fn, c.eval.diversity, c.eval.samples = testing.PARITY, True, 4
    results = eval_mode.run_eval(config_lib.spec(c), str(tmp_path))
    assert 0 < results["eval/arithmetic/distinct4"] <= 1
    assert 0 <= results["eval/arithmetic/self_bleu"] <= 1
    assert results["eval/average/logdet"] > 0


def test_the_memory_metrics_say_whether_a_problem_came_back():
    """`prefix_recalled`: the share of hard groups whose problem had prefixes from earlier
    steps (a problem twice in one batch is not); `novelty_recalled`: the share of groups
    with a correct response whose problem had earlier correct responses."""
    from types import SimpleNamespace

    from explore_rl.data.tasks import Problem

    ex = regenerator(min_gap=2)
    tokens = np.array([[1, 9, 2, 3, 9, 4, 5, 9, 1, 2, 9, 3], [6, 9, 7, 8, 9, 1, 2, 9, 3, 4, 9, 5]])
    ro, ctx = hard_group(tokens, np.full(tokens.shape, 0.5))
    _, prefixes, first = ex.regenerate({}, ro, np.zeros(2, bool), ctx)
    _, _, again = ex.regenerate(prefixes, ro, np.zeros(2, bool), ctx)
    assert (first["prefix_recalled"], again["prefix_recalled"]) == (0.0, 1.0)
    twice = SimpleNamespace(**{**vars(ro), "problems": ro.problems * 2})
    twice.correct = np.zeros((2, len(tokens)), bool)
    twice.prompt_mask = np.ones((2, 10), bool)
    twice.out = SimpleNamespace(
        tokens=np.tile(tokens, (2, 1)), mask=np.ones((4, 12), bool), entropy=np.full((4, 12), 0.5)
    )
    _, _, same_batch = ex.regenerate({}, twice, np.zeros(4, bool), ctx)
    assert same_batch["hard"] == 2 and same_batch["prefix_recalled"] == 0.0

    c = extra_config.get_config("novelty,smoke")
    c.exploration.extra.features = "ngram"
    (ex,) = base.build(config_lib.spec(c))
    seen, fresh, unsolved = Problem("a", "1"), Problem("b", "2"), Problem("c", "3")
    remembered = [extra.pack(np.ones(extra.NGRAM_DIM, np.float32))]
    memory = {seen.id: remembered, unsolved.id: remembered}
    state = {
        "pushed": np.int32(0),
        "host": HostState({"correct": memory, "prefixes": {}, "queue": []}),
    }
    ro = SimpleNamespace(
        plan=SimpleNamespace(info={"extra": {"guided": np.zeros(6, bool), "taken": np.zeros(6)}}),
        correct=np.array([[True, False], [True, False], [False, False]]),
        group_size=2,
        problems=[seen, fresh, unsolved],  # the unsolved group's bonus reads no memory
        out=SimpleNamespace(tokens=np.ones((6, 6), np.int32), mask=np.ones((6, 6), bool)),
    )
    out = ex.shape_advantages(
        state, ro, np.zeros(6, np.float32), np.ones(6, np.float32), SimpleNamespace(step=0)
    )
    assert out.metrics["novelty_recalled"] == 0.5


@pytest.mark.slow
def test_a_pool_of_the_batchs_size_brings_every_problem_back_to_the_memory(tmp_path):
    """`rollout.pool` = the prompts a step: the same problems every step, so from step 2
    every group's problem has earlier correct responses in the novelty memory, and the
    memory holds those problems alone."""
    c = _smoke(steps=4)
    c.rollout.pool = c.rollout.prompts
    progress = loop.train(config_lib.spec(c), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert len(progress.explorers["extra"]["host"].data["correct"]) == c.rollout.pool == 2
    assert [r["extra/novelty_recalled"] for r in rows] == [0.0, 1.0, 1.0, 1.0]

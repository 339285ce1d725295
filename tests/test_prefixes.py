"""Response prefixes (ExTra's guided prompts): the policy continues after the prefix, the
reward sees prefix + response, the update scores the response tokens only; problems have
stable ids."""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, forward, score

from configs import grpo
from explore_rl import config as config_lib
from explore_rl.data.tasks import Problem
from explore_rl.rewards.math import Verifier
from explore_rl.rewards.registry import Reward
from explore_rl.rl import rollout
from explore_rl.rl.plan import base_plan
from explore_rl.sampling.sampler import SamplingConfig

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]

PREFIX_TEXT = "Let me add: 3 + 4 ="


def saw_the_prefix(response, problem):
    """1 when the text the reward gets starts with the guided prefix."""
    return float(response.startswith(PREFIX_TEXT))


@pytest.fixture(scope="module")
def guided():
    c = grpo.get_config("smoke")
    params, cfg, tok = config_lib.resolve(c).model.load(c.seed)
    prefix = tuple(tok.encode(PREFIX_TEXT))
    problems = [Problem("What is 3 + 4?", "7", prefix), Problem("What is 1 + 1?", "2")]
    g, t = 3, 6
    generation = {
        **config_lib.spec(c).generation(),
        "reward": Reward.of(saw_the_prefix),
        "sampling": SamplingConfig(t),  # no stop ids: every row has t response tokens
    }
    plan = base_plan(len(problems) * g, t, 1.0, problems)
    with Verifier(1, 5.0) as verifier:
        ro = rollout.generate(params, cfg, tok, plan, jax.random.key(3), verifier, **generation)
    return params, cfg, tok, ro, prefix, g, generation["prompt"].instruction


def test_problem_ids_are_stable_and_ignore_the_prefix():
    p = Problem("What is 3 + 4?", "7")
    assert p.id == Problem("What is 3 + 4?", "7").id == Problem("What is 3 + 4?", "7", (5,)).id
    assert p.id != Problem("What is 3 + 4?", "8").id
    # a digest of the text (not Python's per-process hash): the same in every process
    assert p.id == hashlib.sha1(b"What is 3 + 4?\x007").hexdigest()[:16]


def test_the_prompt_row_ends_with_the_prefix_and_rewards_see_it(guided):
    params, cfg, tok, ro, prefix, g, instruction = guided
    chat = tok.encode_chat([{"role": "user", "content": "What is 3 + 4?" + instruction}])
    row = ro.prompts[0][ro.prompt_mask[0]].tolist()
    assert row == chat + list(prefix)  # the assistant turn starts with the prefix
    other = ro.prompts[1][ro.prompt_mask[1]].tolist()
    assert other == tok.encode_chat([{"role": "user", "content": "What is 1 + 1?" + instruction}])
    assert all(t.startswith(PREFIX_TEXT) for t in ro.texts[:g])
    assert not any(t.startswith(PREFIX_TEXT) for t in ro.texts[g:])
    np.testing.assert_array_equal(ro.rewards, [[1.0] * g, [0.0] * g])
    assert (np.asarray(ro.out.mask).sum(axis=1) == 6).all()  # response tokens only


def test_mu_and_the_update_score_only_the_response_after_the_prefix(guided):
    params, cfg, tok, ro, prefix, g, _ = guided
    logp, _ = score(
        params,
        cfg,
        jnp.asarray(ro.prompts),
        jnp.asarray(ro.prompt_mask),
        ro.out.tokens,
        ro.out.mask,
    )
    for b in (0, g - 1, g):  # guided rows and a plain one
        p = ro.prompts[b // g][ro.prompt_mask[b // g]]
        response = np.asarray(ro.out.tokens[b])
        seq = jnp.asarray(np.concatenate([p, response]))[None]
        logits = forward(
            params, cfg, seq, jnp.arange(seq.shape[1])[None], jnp.ones_like(seq, bool)
        ).logits[0]
        full = jax.nn.log_softmax(logits)[len(p) - 1 : -1]
        ref = np.asarray(full[jnp.arange(len(response)), response])
        scale = float(jnp.abs(logits[len(p) - 1 : -1]).max())  # what the log-probs come from
        # one log-prob per response token, none for the prefix (it is prompt: no loss)
        assert logp.shape[1] == len(response)
        assert_float32_close(logp[b], ref, scale=scale)
        assert_float32_close(ro.out.logprobs[b], ref, scale=scale)  # mu

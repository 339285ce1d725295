"""bfloat16 end to end, from shapes only (`jax.eval_shape`, `jax.make_jaxpr`: nothing is
computed): the paper configs compute in bfloat16 over float32 weights; a bfloat16 step
keeps its activations and KV cache in bfloat16, runs every forward matmul on bfloat16
operands, and keeps log-probs, the loss and the gradients of float32 weights in float32."""

import collections

import jax
import jax.numpy as jnp
import pytest

from explore_rl import config as config_lib
from explore_rl.bench.fit import PAPER_CONFIGS
from explore_rl.models import presets, transformer
from explore_rl.rl import losses
from explore_rl.rl.train_step import Batch, _loss
from explore_rl.sampling import sampler

A, F32, BF16 = jax.ShapeDtypeStruct, jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)
Q, G, P, T = 2, 2, 5, 8  # prompts, rows a prompt, prompt and response tokens
V = 97  # a vocabulary no other dimension equals: the LM head's matmuls are the ones with it


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_configs_compute_in_bfloat16_over_float32_weights(name):
    s = config_lib.resolve(config_lib.load(f"configs/{name}.py:paper"))
    assert (s.model.dtype, s.model.param_dtype) == ("bfloat16", "float32")


def _dtypes(tree) -> set:
    return {jnp.dtype(x.dtype) for x in jax.tree.leaves(tree)}


def _dots(jaxpr, found: collections.Counter) -> collections.Counter:
    """(operand dtypes, result dtype, operand shapes) of every matmul in `jaxpr` and its
    sub-programs."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            ins = tuple(str(v.aval.dtype) for v in eqn.invars)
            found[ins, str(eqn.outvars[0].aval.dtype), tuple(v.aval.shape for v in eqn.invars)] += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _dots(inner, found)
    return found


def _batch():
    i32 = jnp.int32
    return Batch(
        A((Q, P), i32), A((Q, P), bool), A((Q * G, T), i32), A((Q * G, T), bool),
        A((Q * G,), F32), A((Q * G, T), F32), A((Q * G, T), F32), A((Q * G,), F32),
    )  # fmt: skip


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("attention", ["blockwise", "fused"])
def test_a_bfloat16_steps_arrays(param_dtype, attention):
    """The paper memory settings (remat, layers scanned) on the test size."""
    cfg = presets.get_preset(
        "tiny-qwen2", dtype="bfloat16", param_dtype=param_dtype, remat="block",
        scan_layers=True, attention=attention, attention_block=4, vocab_size=V,
    )  # fmt: skip
    params = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    assert _dtypes(params) == {jnp.dtype(param_dtype)}
    prompts, pmask = A((Q, P), jnp.int32), A((Q, P), bool)

    # the rollout: its KV cache (shared prompts and rows), hidden states, mu and entropy
    def rollout(w, p, m):
        temps = jnp.ones((Q * G, T))
        state, _ = sampler.start(
            w, cfg, p, m, jax.random.key(0), temps, sampler.SamplingConfig(T), None, None
        )
        return state

    state = jax.eval_shape(rollout, params, prompts, pmask)
    cache = state.cache
    assert _dtypes([cache.k, cache.v, cache.prefix_k, cache.prefix_v]) == {BF16}
    assert _dtypes([state.out.logprobs, state.out.entropy]) == {F32}
    hidden = jax.eval_shape(
        lambda w, t, m: transformer.hidden_states(w, cfg, t, t, m).hidden, params, prompts, pmask
    )
    assert hidden.dtype == BF16

    # the update: every forward matmul on bfloat16 operands (scores and logits accumulate
    # in float32), the LM head's backward too; the loss in float32; each gradient its
    # weight's dtype
    lc, batch = losses.LossConfig(), _batch()
    loss = lambda w, b: _loss(w, cfg, lc, b, jnp.float32(1.0))  # noqa: E731
    forward = _dots(jax.make_jaxpr(loss)(params, batch).jaxpr, collections.Counter())
    assert forward and {ins for ins, _, _ in forward} == {("bfloat16", "bfloat16")}, forward
    assert {out for _, out, _ in forward} == {"bfloat16", "float32"}
    gradient = jax.make_jaxpr(jax.grad(lambda w, b: loss(w, b)[0]))(params, batch)
    head = [d for d in _dots(gradient.jaxpr, collections.Counter()) if V in sum(d[2], ())]
    assert len(head) >= 3 and all(ins == ("bfloat16", "bfloat16") for ins, _, _ in head), head
    (value, metrics), grads = jax.eval_shape(jax.value_and_grad(loss, has_aux=True), params, batch)
    assert value.dtype == F32 and _dtypes(metrics) <= {F32}
    assert jax.tree.map(lambda g: g.dtype, grads) == jax.tree.map(lambda p: p.dtype, params)

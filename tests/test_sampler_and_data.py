"""Greedy KV-cache generation vs a naive argmax loop; the arithmetic task."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch

from explore_rl.data import tasks
from explore_rl.models import presets, transformer
from explore_rl.sampling.sampler import greedy

jax.config.update("jax_default_matmul_precision", "highest")


def naive_greedy(params, cfg, tokens, mask, n, stop_ids):
    """Full forward over the growing sequence each step, per row."""
    out = []
    for row, m in zip(np.asarray(tokens), np.asarray(mask)):
        seq = list(row[m])
        new = []
        for _ in range(n):
            x = jnp.asarray([seq])
            logits = transformer.forward(
                params, cfg, x, jnp.arange(len(seq))[None], jnp.ones_like(x, bool)
            ).logits
            new.append(int(jnp.argmax(logits[0, -1])))
            seq.append(new[-1])
            if new[-1] in stop_ids:
                break
        out.append(new)
    return out


def test_greedy_matches_naive_loop_and_stops():
    cfg = presets.get_preset("tiny-qwen2")
    params = transformer.init_params(cfg, jax.random.key(1), scale=0.5)
    tokens, mask = left_padded_batch(np.random.default_rng(3), [7, 3, 5], 64, 7)
    free = naive_greedy(params, cfg, tokens, mask, 10, ())
    stop = free[0][4]  # a token row 0 emits at step 4: row 0 must stop there
    gen = greedy(
        params, cfg, jnp.asarray(tokens), jnp.asarray(mask), max_new_tokens=10, stop_ids=(stop,)
    )
    ref = naive_greedy(params, cfg, tokens, mask, 10, (stop,))
    for i in range(3):
        got = np.asarray(gen.tokens[i])[np.asarray(gen.mask[i])].tolist()
        assert got == ref[i]
        assert bool(gen.finished[i]) == (ref[i][-1] == stop)
    assert len(ref[0]) <= 5 and bool(gen.finished[0])


def test_arithmetic_is_deterministic_exact_and_split():
    a = tasks.make_arithmetic(50, seed=3, num_operands=3, max_digits=2, ops="+-*")
    assert a == tasks.make_arithmetic(50, seed=3, num_operands=3, max_digits=2, ops="+-*")
    for p in a:
        expr = p.question.removeprefix("What is ").removesuffix("?")
        assert int(p.answer) == eval(expr)  # Python's precedence is the stated one
    train = {p.question for p in tasks.make_arithmetic(300, seed=0)}
    test = {p.question for p in tasks.make_arithmetic(100, seed=0, split="test")}
    assert not train & test and len(train) + len(test) == 100  # 1-digit a + b: 100 in all
    with pytest.raises(ValueError, match="ops='/'"):
        tasks.make_arithmetic(1, ops="/")

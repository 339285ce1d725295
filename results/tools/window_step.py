"""The rollout engine's decode step attending a window of the response slots against all
of them: one chunk of 16 steps of 8 slots (lab-1m's shape with the embedded tokenizer's
49k vocabulary, float32, a 64-token prompt, every token forced), run with the window the
engine picks at each given position and with all T slots, the two alternating chunk by
chunk; the median ms a step of each.

    python results/tools/window_step.py [--new-tokens 4096] [--reps 6]
        [--positions 100,400,900,1800,3000]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl.models import weights
from explore_rl.sampling import engine, sampler
from explore_rl.sampling.engine import EngineConfig
from explore_rl.sampling.sampler import SamplingConfig

SLOTS, CHUNK = 8, 16


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--new-tokens", type=int, default=4096)
    p.add_argument("--reps", type=int, default=6, help="timed chunks of each window")
    p.add_argument("--positions", default="100,400,900,1800,3000")
    args = p.parse_args()
    n_new, b = args.new_tokens, 2 * SLOTS
    params, cfg, _ = weights.load(weights.EMBEDDED, "lab-1m")
    prompts = jax.random.randint(jax.random.key(1), (1, 64), 1, cfg.vocab_size)
    tau, sc, rows = jnp.ones((b, n_new)), SamplingConfig(n_new), jnp.zeros((b,), jnp.int32)
    prompt_cache, last = engine._prefill_prompts(
        params, cfg, prompts, jnp.ones(prompts.shape, bool), None, rows
    )
    u = sampler.row_uniforms(jax.random.key(0), b, n_new)
    slots = engine._empty(cfg, SLOTS, prompt_cache.mask.shape[1], n_new, 0, b, False)
    enter = jnp.arange(SLOTS, dtype=jnp.int32)
    slots = engine._enter(params, cfg, slots, enter, prompt_cache, last, rows, tau, u, sc, None)
    never = jnp.asarray(SLOTS + 1)  # no chunk ends early

    def chunk(s, window):
        return engine._chunk(params, cfg, s, never, tau, u, sc, None, CHUNK, window)

    def copy(s):  # a chunk takes (donates) its slots
        return jax.block_until_ready(jax.tree.map(jnp.copy, s))

    at = 0
    for position in (int(x) for x in args.positions.split(",")):
        while at < position:
            slots, ran = chunk(slots, n_new)
            at += int(ran)
        windows = (sampler.window_for(EngineConfig().window, at + CHUNK, n_new), n_new)
        times = {w: [] for w in windows}
        for w in windows:  # compiles
            jax.block_until_ready(chunk(copy(slots), w))
        for rep in range(args.reps):
            for w in windows if rep % 2 == 0 else windows[::-1]:
                s = copy(slots)
                start = time.perf_counter()
                jax.block_until_ready(chunk(s, w))
                times[w].append((time.perf_counter() - start) / CHUNK * 1e3)
        ms = [float(np.median(times[w])) for w in windows]
        print(
            f"position {at}: window {windows[0]} {ms[0]:.2f} ms a step, all {n_new} "
            f"{ms[1]:.2f}, ratio {ms[0] / ms[1]:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

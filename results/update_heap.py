"""The CPU demo's memory bench with each optimizer step's peak RSS recorded, with the
update's `memory.settle` before each step as the library does it ("on") or replaced by a
wait alone ("off"): each step is awaited before the next either way, so the two differ only
in the trim. Prints one line: for each optimizer step of the two training steps (four
each), its peak and end RSS (GiB, absolute). The bench's own measured figure is not
printed: resetting the peak at each step leaves it the last step's.

    python results/update_heap.py on|off
"""

from __future__ import annotations

import contextlib
import io
import sys

import jax


def main(mode: str) -> None:
    from explore_rl import memory
    from explore_rl.bench import main as bench
    from explore_rl.bench.common import reset_peak_rss, rss_bytes
    from explore_rl.train import steps

    if mode == "off":
        memory.settle = jax.block_until_ready
    gib = lambda b: round(b / 2**30, 3)  # noqa: E731
    calls, train_step = [], steps.train_step

    def recorded(*args, **kwargs):
        reset_peak_rss()
        out = jax.block_until_ready(train_step(*args, **kwargs))
        calls.append((gib(rss_bytes("VmHWM")), gib(rss_bytes())))
        return out

    steps.train_step = recorded
    with contextlib.redirect_stdout(io.StringIO()):
        bench(["memory", "--config", "configs/grpo.py:demo", "--random-init", "smollm2-135m",
               "--steps", "2"])  # fmt: skip
    print(mode, "steps (peak, end)", calls)


if __name__ == "__main__":  # the verifier's workers import this module
    main(sys.argv[1])

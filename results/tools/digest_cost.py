"""What a checkpoint's digest costs: writing and checking the digest of one saved step of
a train state of `--gib` GiB (float32 params and two AdamW moments, as a run saves them),
against the time Orbax takes to write that step, in the same run.

    python results/tools/digest_cost.py --gib 1
"""

import argparse
import os
import tempfile
import time

import jax

from explore_rl import checkpoint


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="the state's size")
    args = parser.parse_args()
    n = int(args.gib * 2**30 / 4 / 3)  # params, two moments
    keys = jax.random.split(jax.random.key(0), 3)  # random: Orbax's compression cannot shrink it
    state = {k: jax.random.normal(key, (n,)) for k, key in zip("pmv", keys)}
    with tempfile.TemporaryDirectory() as root:
        ckpt = checkpoint.Checkpointer(root, keep=1, main=False)  # no digest in save's wait
        t0 = time.perf_counter()
        ckpt.save(1, state)
        ckpt.close()
        t1 = time.perf_counter()
        checkpoint.write_digest(ckpt.folder, 1)
        t2 = time.perf_counter()
        step = os.path.join(ckpt.folder, "1")
        on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(step) for f in fs)
        assert checkpoint.check_digest(ckpt.folder, 1) is None
        t3 = time.perf_counter()
    gib = on_disk / 2**30
    print(
        f"state {3 * n * 4 / 2**30:.2f} GiB, {gib:.2f} GiB on disk: Orbax save {t1 - t0:.2f} s, "
        f"digest written {t2 - t1:.2f} s "
        f"({gib / (t2 - t1):.2f} GiB/s), checked {t3 - t2:.2f} s; digest / save "
        f"{(t2 - t1) / (t1 - t0):.2f}"
    )


if __name__ == "__main__":
    main()

"""Two CPU processes joined by `jax.distributed` on localhost against one process (one
device, and two fake devices: the same mesh), on a smoke config: the step's seconds
(steps 2.. averaged) and every logged value other than timings that differs between the
two processes and the one process of the same mesh (none, when they agree).

    python results/tools/two_processes.py [--config configs/ase.py:smoke] [--steps 4]
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile

from explore_rl import testing
from explore_rl.logs import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMES = ("time/rollout_s", "time/pi_old_s", "time/update_s")


def _timing(key: str) -> bool:
    return key.startswith(("time/", "perf/")) or key.endswith("_s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/grpo.py:smoke")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    command = [
        sys.executable, "-m", "explore_rl.main", f"--config={args.config}",
        "--config.train.eval_every=0", f"--config.train.steps={args.steps}",
        f"--config.reward.fn={testing.PARITY}",  # mixed groups: real updates
    ]  # fmt: skip
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.path.join(ROOT, "tests"))
    env.pop("XLA_FLAGS", None)
    two_devices = dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = tempfile.mkdtemp()
    runs = {"1 process": env, "1 process, 2 devices": two_devices}
    for name, run_env in runs.items():
        workdir = os.path.join(out, name)
        subprocess.run([*command, f"--workdir={workdir}"], env=run_env, check=True, cwd=ROOT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = os.path.join(out, "2 processes")
    procs = [
        subprocess.Popen(
            [
                *command,
                f"--workdir={workdir}",
                f"--coordinator=127.0.0.1:{port}",
                "--num_processes=2",
                f"--process_id={i}",
            ],
            env=env,
            cwd=ROOT,
        )  # fmt: skip
        for i in range(2)
    ]
    if any(p.wait() for p in procs):
        sys.exit("the two-process run failed")
    for name in (*runs, "2 processes"):
        rows = read_metrics(os.path.join(out, name))[1:]  # the first step compiles
        seconds = {k: statistics.mean(r[k] for r in rows) for k in TIMES}
        parts = " + ".join(f"{seconds[k]:.3f}" for k in TIMES)
        print(f"{name}: rollout + pi_old + update = {parts} = {sum(seconds.values()):.3f} s")
    same, two = read_metrics(os.path.join(out, "1 process, 2 devices")), read_metrics(workdir)
    for a, b in zip(same, two):
        differ = {k: (a[k], b.get(k)) for k in a if not _timing(k) and a[k] != b.get(k)}
        print(f"step {a['step']}: values that differ between the two processes and one: {differ}")


if __name__ == "__main__":
    main()

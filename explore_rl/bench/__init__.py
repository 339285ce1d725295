"""Benchmarks, each reported as a fraction of a limit measured in the same run.

    python -m explore_rl.bench forward [--batch 64] [--length 128] [--dtype float32]
    python -m explore_rl.bench sample [--no-peer]
    python -m explore_rl.bench step
    python -m explore_rl.bench startup
    python -m explore_rl.bench memory [--config configs/grpo.py:demo] [--steps 2]
    python -m explore_rl.bench lab [--set task.countdown.inputs=3]
    python -m explore_rl.bench lora [--ranks 1 8 32]
    python -m explore_rl.bench {scale,engine,long,depth,fit} ...

One module per benchmark (its docstring says what it measures and how): `HELP`, its
flags (`add_arguments`), an optional `check(args)` (a one-line refusal), and
`run(args) -> dict`, the result printed as one JSON line with the machine.
`forward`, `sample` and `step` take `--model` (a folder, .gguf or "embedded") and
`--random-init PRESET` (random weights of a preset's shape, `--model`'s tokenizer: e.g.
`--random-init qwen2.5-math-7b` times a 7B shape with no checkpoint on disk).

"""

from __future__ import annotations

import argparse
import json
import platform

import jax

from explore_rl.bench import (
    depth,
    engine,
    fit,
    forward,
    lab,
    long,
    lora,
    memory,
    sample,
    scale,
    startup,
    step,
)  # fmt: skip

BENCHES = {
    "forward": forward,
    "sample": sample,
    "step": step,
    "startup": startup,
    "scale": scale,
    "engine": engine,
    "memory": memory,
    "long": long,
    "depth": depth,
    "fit": fit,
    "lab": lab,
    "lora": lora,
}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m explore_rl.bench", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, module in BENCHES.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP))
    args = parser.parse_args(argv)
    module = BENCHES[args.bench]
    if hasattr(module, "check") and (problem := module.check(args)):
        parser.error(problem)
    result = module.run(args)
    result["machine"] = (
        f"{platform.processor() or platform.machine()}, "
        f"{jax.device_count()} x {jax.devices()[0].device_kind}, jax {jax.__version__}"
    )
    print(json.dumps(result))
    return result

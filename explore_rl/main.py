"""Command line entry point.

    python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/demo

Modes: `sample` prints greedy continuations of the task's test questions with the
configured model and writes them to WORKDIR/samples/.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags
from ml_collections import config_flags

from explore_rl.data import tasks
from explore_rl.models import weights
from explore_rl.sampling import sampler

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (config, samples, ...).")
_MODE = flags.DEFINE_enum("mode", "sample", ["sample"], "What to run.")


def run_sample(config, workdir: str | None) -> list[dict]:
    start = time.perf_counter()
    params, cfg, tok = weights.load_model(
        config.model.path, param_dtype=config.model.param_dtype, dtype=config.model.dtype
    )
    print(
        f"loaded {config.model.path} ({cfg.family}, {cfg.num_params() / 1e6:.0f}M params) "
        f"in {time.perf_counter() - start:.1f}s"
    )
    t = config.task
    problems = tasks.make_arithmetic(
        config.sample.num_prompts,
        seed=config.seed,
        split="test",
        num_operands=t.num_operands,
        min_digits=t.min_digits,
        max_digits=t.max_digits,
        ops=t.ops,
    )
    rows = [
        tok.encode_chat([{"role": "user", "content": f"{p.question}{t.instruction}"}])
        for p in problems
    ]
    tokens, mask = sampler.left_pad(rows, tok.pad_id)
    start = time.perf_counter()
    gen = sampler.greedy(
        params,
        cfg,
        tokens,
        mask,
        max_new_tokens=config.sample.max_new_tokens,
        stop_ids=tok.stop_ids,
    )
    gen.tokens.block_until_ready()
    seconds = time.perf_counter() - start
    samples = []
    for p, toks, m in zip(problems, gen.tokens.tolist(), gen.mask.tolist()):
        text = tok.decode([x for x, keep in zip(toks, m) if keep])
        samples.append({"question": p.question, "answer": p.answer, "response": text})
        print(f"\n> {p.question}   [answer {p.answer}]\n{text}")
    print(
        f"\n{len(samples)} greedy samples, {sum(map(sum, gen.mask.tolist()))} tokens "
        f"in {seconds:.1f}s (compile included)"
    )
    if workdir:
        os.makedirs(os.path.join(workdir, "samples"), exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json(indent=2))
        with open(os.path.join(workdir, "samples", "greedy.jsonl"), "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in samples)
    return samples


def main(argv):
    del argv
    if _MODE.value == "sample":
        run_sample(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)

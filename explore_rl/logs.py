"""Run-directory logging: metrics.jsonl, TensorBoard scalars, decoded samples, W&B.

One JSON object per logged step in WORKDIR/metrics.jsonl (`step` plus scalar metrics),
the same scalars as TensorBoard events in WORKDIR (no TensorFlow needed), and a few
decoded rollouts per logged step in WORKDIR/samples/step_XXXXXXX.jsonl. `step` counts
completed updates; on resume, lines past the restored step are dropped first, so a rerun
never duplicates a step.

With `wandb` settings (`wandb.init` arguments: project, name, tags, config) the scalars
also go to Weights & Biases, its files under WORKDIR/wandb (`WANDB_MODE=offline` needs no
network; `wandb sync` uploads them later). The run id is kept in WORKDIR/wandb_id, so a
resumed run continues the same W&B run; W&B keeps the first value it received for a step,
so steps logged after the restored checkpoint and then recomputed keep their first values
there (metrics.jsonl has the recomputed ones).
"""

from __future__ import annotations

import json
import os
import secrets
import time

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def _scalar(v) -> float:
    return float(np.asarray(v))


def _wandb():
    try:
        import wandb
    except ImportError:
        raise ValueError("logging.wandb=True needs the wandb package (pip install wandb)") from None
    return wandb


def _wandb_refused(e: Exception) -> ValueError:
    """W&B's words (no login, a bad setting), one line, with the way out."""
    return ValueError(
        f"logging.wandb=True: W&B says: {str(e).strip()} (or WANDB_MODE=offline to log "
        "without an account; `wandb sync` uploads later)"
    )


def check_wandb(settings: dict | None) -> None:
    """W&B's package and login, checked before any weight is read: without them a run
    would stop only when its logger opens, after the model loads. Offline or disabled
    (`WANDB_MODE`) needs no login."""
    if settings is None:
        return
    wandb = _wandb()
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return
    try:
        wandb.login(verify=False)
    except wandb.errors.UsageError as e:
        raise _wandb_refused(e) from None


def _wandb_run(workdir: str, settings: dict):
    wandb = _wandb()
    id_file = os.path.join(workdir, "wandb_id")
    if os.path.exists(id_file):
        with open(id_file) as f:
            run_id = f.read().strip()
    else:
        run_id = secrets.token_hex(4)  # W&B ids: short, lowercase, alphanumeric
        with open(id_file, "w") as f:
            f.write(run_id + "\n")
    try:
        return wandb.init(id=run_id, resume="allow", dir=workdir, **settings)
    except wandb.errors.UsageError as e:
        raise _wandb_refused(e) from None


class RunLogger:
    """metrics.jsonl, TensorBoard, W&B and samples/ of a run. In a run of several
    processes one writes (`write`); the others' calls do nothing."""

    def __init__(
        self, workdir: str, start_step: int = 0, wandb: dict | None = None, write: bool = True
    ):
        self.workdir, self.write = workdir, write
        if not write:
            return
        os.makedirs(os.path.join(workdir, "samples"), exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._truncate(start_step)
        self.tb = EventFileWriter(workdir)
        self.wandb = None if wandb is None else _wandb_run(workdir, wandb)

    def _truncate(self, start_step: int):
        """Keep the lines up to the restored step (none before any checkpoint: a starting
        evaluation, step 0, is run again); a line torn by a kill mid-write (the last one)
        goes too. Rewritten through a temporary file and a rename, so a kill here loses
        nothing."""
        if not os.path.exists(self.path):
            return
        rows = read_metrics(self.workdir) if start_step else []
        keep = [json.dumps(r) + "\n" for r in rows if r["step"] <= start_step]
        with open(self.path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(self.path + ".tmp", self.path)

    def log(self, step: int, metrics: dict, samples: list[dict] | None = None):
        if not self.write:
            return
        row = {"step": step, **{k: _scalar(v) for k, v in sorted(metrics.items())}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        values = [
            summary_pb2.Summary.Value(tag=k, simple_value=v)
            for k, v in row.items()
            if k != "step" and np.isfinite(v)
        ]
        self.tb.add_event(
            event_pb2.Event(
                wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
            )
        )
        self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step"}, step=step)
        if samples:
            name = os.path.join(self.workdir, "samples", f"step_{step:07d}.jsonl")
            with open(name, "w") as f:
                f.writelines(json.dumps(s) + "\n" for s in samples)

    def close(self):
        if not self.write:
            return
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(workdir: str) -> list[dict]:
    """The logged steps; a last line torn by a kill mid-write (no newline, not JSON) is
    left out, as the resumed run rewrites that step."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        lines = f.read().split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:  # only a line without its newline can be torn
                raise ValueError(f"{workdir}/metrics.jsonl:{i + 1}: not JSON") from None
    return rows


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested config (a run's config.json, `ConfigDict.to_dict()`) as {"a.b": value},
    lists as tuples (JSON's lists and the config's tuples then compare equal)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = tuple(v) if isinstance(v, list) else v
    return out

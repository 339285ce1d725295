"""Orbax checkpoints of the train state: save every N steps and at the end, keep the last
k, and restore the newest complete one (Orbax writes to a temporary name and renames, so
a run killed mid-save leaves the previous checkpoint as the newest)."""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, workdir: str, keep: int = 3):
        self.manager = ocp.CheckpointManager(
            os.path.abspath(os.path.join(workdir, "checkpoints")),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, force: bool = False):
        self.manager.save(step, args=ocp.args.StandardSave(state), force=force)

    def restore(self, step: int, like):
        """Restore into the structure, shapes, dtypes and shardings of `like`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()

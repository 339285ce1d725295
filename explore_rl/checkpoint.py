"""Orbax checkpoints of the train state: save every N steps and at the end, keep the last
k, and restore the newest complete one (Orbax writes to a temporary name and renames, so
a run killed mid-save leaves the previous checkpoint as the newest).

A step holds two items: `state`, every array of the run's progress, and `host`, the
JSON data of each `HostState` in it (explorers' per-problem memories, queues), so both
are written and made visible together."""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from explore_rl.hoststate import host_states


class Checkpointer:
    def __init__(self, workdir: str, keep: int = 3):
        self.manager = ocp.CheckpointManager(
            os.path.abspath(os.path.join(workdir, "checkpoints")),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, force: bool = False):
        host = {path: h.data for path, h in host_states(state).items()}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host))
        self.manager.save(step, args=args, force=force)

    def restore(self, step: int, like):
        """Restore into the structure, shapes, dtypes and shardings of `like`; each
        `HostState` of `like` gets the data saved for its place."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()
        )
        out = self.manager.restore(step, args=args)
        restored, saved = out.state, out.host or {}
        for path, h in host_states(restored).items():
            h.data = saved.get(path, h.data)
        return restored

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()

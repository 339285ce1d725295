"""Orbax checkpoints of the train state: save every N steps and at the end, keep the last
k, and restore the newest complete one (Orbax writes to a temporary name and renames, so
a run killed mid-save leaves the previous checkpoint as the newest). A write that fails
(disk full, quota) is reported as `SaveFailed`, naming the step lost and the newest
complete one, which the failed write never touched.

A step holds two items: `state`, every array of the run's progress, and `host`, the
JSON data of each `HostState` in it (explorers' per-problem memories, queues), so both
are written and made visible together."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
import time

import jax
import orbax.checkpoint as ocp

from explore_rl.hoststate import host_states


class SaveFailed(OSError):
    """A checkpoint could not be written; the previous complete one is intact."""


class Checkpointer:
    def __init__(self, workdir: str, keep: int = 3):
        self._pending: int | None = None  # the step whose background write may still fail
        self.manager = ocp.CheckpointManager(
            os.path.abspath(os.path.join(workdir, "checkpoints")),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_handlers={  # named, so a step's metadata is readable before a restore
                "state": ocp.StandardCheckpointHandler(),
                "host": ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, force: bool = False):
        host = {path: h.data for path, h in host_states(state).items()}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host))
        self._wait()  # the previous write has had a step to finish: a failure is its own
        with self._reporting(step):
            self.manager.save(step, args=args, force=force)
        self._pending = step

    def restore(self, step: int, like):
        """Restore into the structure, shapes, dtypes and shardings of `like`; each
        `HostState` of `like` gets the data saved for its place."""
        saved = _leaves(self.manager.item_metadata(step)["state"])
        _check_matches(saved, _leaves(like), str(self.manager.directory), step)
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
        try:
            self._wait()
        finally:
            self.manager.close()

    def _wait(self):
        with self._reporting(self._pending):
            self.manager.wait_until_finished()
        self._pending = None

    @contextlib.contextmanager
    def _reporting(self, step: int | None):
        """Orbax raises the storage layer's error, whatever its type, when a write fails (for
        a background write: at the next wait); it becomes one `SaveFailed` that says what
        was lost and what survives."""
        try:
            yield
        except Exception as error:
            if step is None or not _is_write_error(error):
                raise
            with contextlib.suppress(Exception):  # its threads would fail again at exit
                self.manager.close()
            folder = str(self.manager.directory)  # a step is complete once renamed to its number
            kept = sorted(int(n) for n in os.listdir(folder) if n.isdigit())
            survivor = f"step {kept[-1]}, is intact" if kept else "none: there is none yet"
            raise SaveFailed(
                f"checkpoint {step} was not written to {folder} ({_reason(error)}); the newest "
                f"complete checkpoint, {survivor}: free space and rerun the same command to "
                "resume"
            ) from error


def open_workdir(workdir: str) -> None:
    """Make the run directory `workdir`, or refuse it (a file, not writable)."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"--workdir {workdir}: a file, not a folder")
    os.makedirs(workdir, exist_ok=True)
    if not os.access(workdir, os.W_OK):
        raise ValueError(f"--workdir {workdir}: not writable")


@contextlib.contextmanager
def only_writer(workdir: str, take: bool = True):
    """While held, no other run writes `workdir`: two resumes of one run would log each
    step twice, and two new runs would race on one temporary checkpoint folder. An
    advisory `flock` on `workdir/.lock`, which the kernel drops when its holder dies (a
    `kill -9` leaves no stale lock); the file names the holder while held and is emptied
    on release, so a run's bytes do not depend on who ran it last. A run of several
    processes takes it once, in its main process (`take`)."""
    if not take:
        yield
        return
    open_workdir(workdir)
    path = os.path.join(workdir, ".lock")
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise ValueError(f"--workdir {workdir}: cannot lock {path} ({e.strerror})") from e
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise ValueError(
                f"--workdir {workdir} is in use by {holder}: one run per work directory "
                "(wait for it to end or stop it)"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%c')}\n")
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)


def _is_write_error(error: BaseException) -> bool:
    return isinstance(error, OSError) or "os_error_code" in str(error)


def _reason(error: BaseException) -> str:
    """The operating system's words for a failed write ("No space left on device")."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    # the storage layer's message varies with the write that failed first; its errno not
    found = re.search(r"os_error_code='?(\d+)", str(error))
    return os.strerror(int(found.group(1))) if found else str(error).splitlines()[0][:200]


def locate(path: str, step: int = 0, step_key: str = "eval.step") -> tuple[str, int]:
    """(the checkpoints folder, the step) named by a run directory, its checkpoints folder
    or one step's folder (`.../checkpoints/6`); `step` 0 = the newest complete one (the
    config field that gave it: `step_key`)."""
    path = os.path.abspath(path)
    if (
        os.path.basename(path).isdigit()
        and os.path.basename(os.path.dirname(path)) == "checkpoints"
    ):
        folder, named = os.path.dirname(path), int(os.path.basename(path))
        if step and step != named:
            raise ValueError(f"eval.checkpoint={path} is step {named}, {step_key}={step}")
        step = named
    elif os.path.isdir(os.path.join(path, "checkpoints")):
        folder = os.path.join(path, "checkpoints")
    else:
        folder = path
    steps = (
        sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []
    )
    if not steps:
        raise ValueError(f"{path}: no checkpoint (a run directory, its checkpoints/ or a step)")
    if step and step not in steps:
        raise ValueError(f"{path}: no checkpoint of step {step} (there are {steps})")
    return folder, step or steps[-1]


def restore_subset(path: str, step: int, like: dict) -> dict:
    """Only the parts of a saved train state that `like` names (e.g. {"state": {"params":
    ...}, "explorers": {...}}), into its shapes, dtypes and shardings: evaluation reads the
    params without allocating the optimizer's moments."""
    manager = ocp.CheckpointManager(path, item_handlers={"state": ocp.PyTreeCheckpointHandler()})
    try:
        _check_matches(_leaves(manager.item_metadata(step)["state"]), _leaves(like), path, step)
    except BaseException:
        manager.close()
        raise
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    args = ocp.args.Composite(state=ocp.args.PyTreeRestore(abstract, partial_restore=True))
    try:
        return manager.restore(step, args=args).state
    finally:
        manager.close()


def _leaves(tree) -> dict[str, tuple]:
    """'a/b/0/c' -> shape, for every leaf (saved metadata or arrays)."""
    return {
        "/".join(map(_part, path)): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def _part(k) -> str:
    """A path entry's name: a dict key, a dataclass field or a list index."""
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _check_matches(saved: dict, wanted: dict, path: str, step: int) -> None:
    """Every wanted array is in the checkpoint with its shape: a checkpoint of another
    model (or method) is refused, naming the first difference."""
    for key, shape in wanted.items():
        if key not in saved:
            raise ValueError(
                f"{path}/{step}: no {key} in the checkpoint (a run of another model or method?)"
            )
        if saved[key] != shape:
            raise ValueError(
                f"{path}/{step}: {key} has shape {saved[key]} there, {shape} here "
                "(a checkpoint of another model?)"
            )

"""Orbax checkpoints of the train state: save every N steps and at the end, keep the last
k, and restore the newest intact one. Orbax writes to a temporary name and renames, so a
run killed mid-save leaves the previous checkpoint as the newest. A write that fails
(disk full, quota) is reported as `SaveFailed`, naming the step lost and the newest
complete one, which the failed write never touched.

Integrity: once a step's write has finished (seen at the end of the next training step),
a digest of its files (`<step>.sha256` beside it: each file's size and SHA-256) is
written; a resume checks the newest step against it and sets a damaged one aside (renamed
`<step>.damaged`, with one line saying so) for the newest intact one. A step whose digest
was never written (the run was killed right after the write) is set aside for an older
digested one; a run's only steps are accepted if Orbax reads them whole and their numbers
are finite, said in one line, and never digested afterwards (a digest vouches only for a
write seen to finish). Old steps are deleted only after a newer one has its digest, so
the step a run resumed from survives until a newer one is known good.

A step holds two items: `state`, every array of the run's progress, and `host`, the
JSON data of each `HostState` in it (explorers' per-problem memories, queues), so both
are written and made visible together."""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
import traceback

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from explore_rl.hoststate import host_states


class SaveFailed(OSError):
    """A checkpoint could not be written; the previous complete one is intact."""


class Damaged(Exception):
    """A checkpoint step that cannot be restored as written (files changed or missing)."""


class Checkpointer:
    """`keep` newest steps of `workdir/checkpoints`, and the best one by `best_metric` (a
    held-out metric, the highest so far: `checkpoints/best.json` names its step, which is
    kept beside the newest); `main`: this process writes the digests and deletes old steps
    (one process of a multi-process run)."""

    def __init__(self, workdir: str, keep: int = 3, main: bool = True, best_metric: str = ""):
        self._pending: int | None = None  # the step whose background write may still fail
        self._pending_best: dict | None = None  # its best.json, written once it is digested
        self.keep, self.main = keep, main
        self.folder = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.best_metric = best_metric
        self.best = read_best(self.folder) if best_metric else None
        if self.best is not None and self.best["metric"] != best_metric:
            raise ValueError(
                f"train.best_metric={best_metric!r}: {self.folder}'s best checkpoint is by "
                f"{self.best['metric']!r} (keep it, or start a new work directory)"
            )
        _drop_late_completions()
        self.manager = ocp.CheckpointManager(
            self.folder,
            # no max_to_keep: Orbax would delete the old steps before the new one is
            # digested; `_prune` deletes them after
            options=ocp.CheckpointManagerOptions(create=True),
            item_handlers={  # named, so a step's metadata is readable before a restore
                "state": ocp.StandardCheckpointHandler(),
                "host": ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def newest_intact(self) -> int:
        """The newest step that matches its digest, 0 if none; newer ones that do not
        match are set aside, one line each. A step without a digest (its write not seen
        to finish: a kill within a step of it) is set aside too where an older step has
        one; the run's only steps are restored as Orbax reads them (`restore` checks
        what it can), said in one line, and never digested."""
        for step in reversed(steps(self.folder)):
            problem = check_digest(self.folder, step)
            if problem == NO_DIGEST:
                older = [s for s in digested(self.folder) if s < step]
                if not older:
                    print(f"checkpoint {step} in {self.folder} has no digest (the run stopped "
                          "before it was written): restored as Orbax reads it, unverified",
                          file=sys.stderr)  # fmt: skip
                    return step
                problem = f"no digest, and step {older[-1]} before it has one"
            if problem is None:
                return step
            self.set_aside(step, problem)
        return 0

    def settle(self) -> None:
        """Digest the background write if it has finished (called after every step), so
        a kill leaves a step without its digest only within a step of its write; in a run
        of several processes, at the next save (every process waits there together)."""
        if jax.process_count() == 1 and self._pending is not None:
            if not self.manager.is_saving_in_progress():
                self._wait()

    def set_aside(self, step: int, problem: str) -> None:
        """Rename a damaged step out of the way (`<step>.damaged`): kept for inspection,
        not restored, and its number free for the resumed run to write again."""
        if self.main:
            target = _free_name(os.path.join(self.folder, f"{step}.damaged"))
            os.rename(os.path.join(self.folder, str(step)), target)
            with contextlib.suppress(FileNotFoundError):
                os.remove(_digest_path(self.folder, step))
            print(
                f"checkpoint {step} in {self.folder} is damaged ({problem}): set aside as "
                f"{os.path.basename(target)}; resuming from the newest intact one",
                file=sys.stderr,
            )
        if jax.process_count() > 1:  # every process lists the steps after the rename
            multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
        self.manager.reload()  # Orbax lists the steps when it opens

    def improves(self, metrics: dict) -> bool:
        """Whether `metrics` (a step's, its evaluation included) beat the best so far."""
        if not self.best_metric:
            return False
        if self.best_metric not in metrics:
            evaluated = sorted(k for k in metrics if k.startswith("eval/"))
            if evaluated:  # an evaluation ran and does not log it: a misspelt name
                raise ValueError(
                    f"train.best_metric={self.best_metric!r} is not an evaluation metric: "
                    f"logged {evaluated[:6]}{' ...' if len(evaluated) > 6 else ''}"
                )
            return False
        value = metrics[self.best_metric]
        return self.best is None or value > self.best["value"]

    def save(self, step: int, state, force: bool = False, best: float | None = None):
        """Write `step` in the background; `best`: its value of `best_metric`, a new best
        (recorded once the step is written and digested)."""
        if best is not None:
            self.best = {"metric": self.best_metric, "step": step, "value": float(best)}
        host = {path: h.data for path, h in host_states(state).items()}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host))
        self._wait()  # the previous write has had a step to finish: a failure is its own
        with self._reporting(step):
            self.manager.save(step, args=args, force=force)
        self._pending, self._pending_best = step, None if best is None else self.best

    def restore(self, step: int, like):
        """Restore into the structure, shapes, dtypes and shardings of `like`; each
        `HostState` of `like` gets the data saved for its place. A step Orbax cannot read
        raises `Damaged`; one of another model, `ValueError`."""
        try:
            saved = _leaves(self.manager.item_metadata(step)["state"])
        except Exception as e:  # an unreadable metadata file, whatever its type
            raise Damaged(f"its metadata cannot be read: {type(e).__name__}") from e
        if not saved:  # Orbax reads a missing metadata file as an empty item
            raise Damaged("its metadata is missing")
        _check_matches(saved, _leaves(like), str(self.manager.directory), step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()
        )
        try:
            out = self.manager.restore(step, args=args)
        except Exception as e:  # tensorstore and Orbax raise many types on bad bytes
            raise Damaged(f"it cannot be read: {type(e).__name__}") from e
        restored, saved = out.state, out.host or {}
        for path, h in host_states(restored).items():
            h.data = saved.get(path, h.data)
        # a step without a digest (the run was killed before it was written) is checked by
        # what Orbax itself knows (its metadata, its reads, above) and by its numbers; it
        # is never digested afterwards: only a write this process saw finish is vouched for
        if check_digest(self.folder, step) == NO_DIGEST and not _finite(restored):
            raise Damaged("it has no digest and holds non-finite numbers")
        return restored

    def close(self):
        try:
            self._wait()
        finally:
            self.manager.close()

    def _wait(self):
        with self._reporting(self._pending):
            self.manager.wait_until_finished()
        if self._pending is not None and self.main:
            write_digest(self.folder, self._pending)
            if self._pending_best is not None:
                write_json(os.path.join(self.folder, BEST), self._pending_best)
            self._prune()
        self._pending = self._pending_best = None

    def _prune(self) -> None:
        """Delete the steps older than the `keep` newest digested ones (with their digests),
        but the best: a step is deleted only once `keep` newer ones are known good."""
        known = digested(self.folder)
        if len(known) < self.keep:
            return
        oldest_kept, best = known[-self.keep], _best_step(self.folder)
        for s in steps(self.folder):
            if s < oldest_kept and s != best:
                shutil.rmtree(os.path.join(self.folder, str(s)))
                with contextlib.suppress(FileNotFoundError):
                    os.remove(_digest_path(self.folder, s))
        self.manager.reload()

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


def _finite(tree) -> bool:
    """Whether every floating-point array of `tree` is finite."""
    return all(
        bool(jax.numpy.isfinite(x).all())
        for x in jax.tree.leaves(tree)
        if hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)
    )


def _drop_late_completions() -> None:
    """Once a background write fails, Orbax closes its event loop while the storage layer's
    other writes of that step are still in flight; each then calls back into the closed
    loop (`call_soon_threadsafe`) from a native thread, and its `RuntimeError('Event loop
    is closed')` went to `sys.unraisablehook`: 63 tracebacks before the run's one line on a
    full disk. Exactly that error from that call is dropped (nothing is left to tell it
    to); any other unraisable error still reaches the hook. Installed once a process."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_late_completions", False):
        return

    def hook(unraisable):
        frames = [f.f_code.co_name for f, _ in traceback.walk_tb(unraisable.exc_traceback)]
        late = isinstance(unraisable.exc_value, RuntimeError) and "call_soon_threadsafe" in frames
        if not (late and str(unraisable.exc_value) == "Event loop is closed"):
            previous(unraisable)

    hook.drops_late_completions = True
    sys.unraisablehook = hook


NO_DIGEST = "no digest"
BEST = "best.json"  # {"metric", "step", "value"} of a run's best checkpoint


def read_best(folder: str) -> dict | None:
    """The best checkpoint's record in a checkpoints folder; None without one, or when its
    step is gone (set aside as damaged)."""
    path = os.path.join(folder, BEST)
    try:
        with open(path) as f:
            best = json.load(f)
        step = best["step"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):  # not the JSON this module writes
        raise ValueError(
            f"{path}: not a best checkpoint's record (its JSON is damaged): restore it, or "
            "move it away (the run then keeps no best checkpoint until the next evaluation)"
        ) from None
    return best if step in steps(folder) else None


def _best_step(folder: str) -> int | None:
    best = read_best(folder)
    return None if best is None else best["step"]


def write_json(path: str, record, indent: int = 0) -> None:
    """Written to a temporary name, synced, then renamed: all or nothing."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=indent)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def steps(folder: str) -> list[int]:
    """The complete steps in a checkpoints folder (Orbax names a step folder by its number
    once its write has finished), oldest first."""
    if not os.path.isdir(folder):
        return []
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit())


def digested(folder: str) -> list[int]:
    """The steps whose digest has been written, oldest first."""
    return [s for s in steps(folder) if os.path.exists(_digest_path(folder, s))]


def _digest_path(folder: str, step: int) -> str:
    return os.path.join(folder, f"{step}.sha256")


def _file_digests(root: str) -> dict[str, list]:
    """{path under root: [size, SHA-256]} of every file; files hashed on several threads
    (hashlib releases the GIL), a few MiB read at a time."""

    def one(path):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        return [os.path.getsize(path), h.hexdigest()]

    paths = sorted(
        os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns
    )
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(paths, pool.map(lambda p: one(os.path.join(root, p)), paths)))


def write_digest(folder: str, step: int) -> None:
    """Digest a finished step."""
    write_json(_digest_path(folder, step), _file_digests(os.path.join(folder, str(step))))


def check_digest(folder: str, step: int) -> str | None:
    """None if the step's files are those its digest lists, else what differs (the first
    file), or NO_DIGEST if it has none."""
    try:
        with open(_digest_path(folder, step)) as f:
            want = json.load(f)
    except FileNotFoundError:
        return NO_DIGEST
    except ValueError:
        return "its digest file is unreadable"
    have = _file_digests(os.path.join(folder, str(step)))
    for name in sorted(want.keys() | have.keys()):
        if name not in have:
            return f"{name} is missing"
        if name not in want:
            return f"{name} was added"
        if have[name] != want[name]:
            return f"{name} differs from its digest"
    return None


def _free_name(path: str) -> str:
    """`path`, or `path.2`, `path.3`... the first that does not exist."""
    n, out = 1, path
    while os.path.exists(out):
        n += 1
        out = f"{path}.{n}"
    return out


def open_workdir(workdir: str) -> None:
    """Make the run directory `workdir`, or refuse it (a file, not writable)."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"--workdir {workdir}: a file, not a folder")
    os.makedirs(workdir, exist_ok=True)
    if not os.access(workdir, os.W_OK):
        raise ValueError(f"--workdir {workdir}: not writable")


class History(ValueError):
    """A work directory whose history (metrics, samples, checkpoints) a new run would
    replace: refused, or with `train.restart` moved aside (`move_history`)."""


def check_history(workdir: str, restorable: bool = True) -> None:
    """Refuse a run directory whose history a new run would replace: `checkpoints` that is
    not a folder, or (once no step is left to restore: `restorable` False) checkpoints
    that were written and are all gone or set aside. Nothing is written either way."""
    folder = os.path.join(workdir, "checkpoints")
    if os.path.lexists(folder) and not os.path.isdir(folder):
        refuse_history(workdir, f"{folder} is not a folder")
    if restorable or not os.path.isdir(folder):
        return
    # a step once complete: kept, set aside or digested (Orbax's temporary folder of a
    # write that never finished is none: the run had no checkpoint yet)
    written = sorted(n for n in os.listdir(folder) if _WRITTEN.fullmatch(n))
    if written:
        shown = ", ".join(written[:4])
        refuse_history(workdir, f"no checkpoint in {folder} can be restored ({shown})")


_WRITTEN = re.compile(rf"\d+|\d+\.damaged(\.\d+)?|\d+\.sha256|{re.escape(BEST)}")


def refuse_history(workdir: str, what: str):
    raise History(
        f"--workdir {workdir}: {what}, and a new run there would replace the run's history "
        "(metrics.jsonl, samples/, config.json): use a new --workdir, or "
        "--config.train.restart=True to move its files aside and start over"
    )


def move_history(workdir: str) -> str:
    """Move every file of `workdir` but its lock into a new folder beside it,
    `<workdir>.replaced` (or `.replaced.2`, ...), whose path is returned."""
    aside = _free_name(os.path.abspath(workdir) + ".replaced")
    os.makedirs(aside)
    for name in os.listdir(workdir):
        if name != ".lock":
            os.rename(os.path.join(workdir, name), os.path.join(aside, name))
    return aside


def enclosing_run(path: str) -> str | None:
    """The run directory (a folder with config.json and checkpoints/) holding `path`, or
    `path` itself: a folder another mode must not write into (its files would replace the
    run's or break its resume)."""
    path = os.path.abspath(path)
    while True:
        if os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(
            os.path.join(path, "checkpoints")
        ):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


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
    made = not os.path.exists(workdir)
    open_workdir(workdir)
    path = os.path.join(workdir, ".lock")
    with open(path, "a+") as f:
        _lock(f, workdir, path)
        try:
            yield
        except BaseException:
            if made:  # a refused new run leaves nothing behind (removed while still held)
                _remove_unused(workdir)
            raise
        finally:
            f.truncate(0)


def _lock(f, workdir: str, path: str) -> None:
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


def writer(workdir: str) -> str | None:
    """Who holds `workdir` now (`only_writer`: its lock's holder), None when no run does.
    The lock is tried shared and let go at once (a run starting in that instant is refused
    as if another run held it)."""
    try:
        f = open(os.path.join(workdir, ".lock"))  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            return f.read().strip() or "another process"
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _remove_unused(workdir: str) -> None:
    """Remove a work directory this process made if it holds nothing but its lock and
    empty folders (a run refused before it wrote anything)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(workdir, ".lock"))
    for root, _, _ in sorted(os.walk(workdir), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):  # a folder with files in it stays
            os.rmdir(root)


class _OrbaxErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname


def quiet_orbax_errors() -> None:
    """Keep Orbax's own error logs (hundreds of lines of its threads' tracebacks on a full
    disk) out of the terminal: every failure they describe also reaches `Checkpointer` as
    an exception, which says it in one line (`SaveFailed`) or raises it whole."""
    logging.getLogger("absl").addFilter(_OrbaxErrors())


def _is_write_error(error: BaseException) -> bool:
    return isinstance(error, OSError) or "os_error_code" in str(error)


def _reason(error: BaseException) -> str:
    """The operating system's words for a failed write ("No space left on device")."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    # the storage layer's message varies with the write that failed first; its errno not
    found = re.search(r"os_error_code='?(\d+)", str(error))
    return os.strerror(int(found.group(1))) if found else str(error).splitlines()[0][:200]


def run_of(path: str) -> str | None:
    """The run directory whose checkpoint `path` names as a model (`model.path`): the run
    directory itself (a folder with checkpoints/), its checkpoints/ folder, one step's or
    its best (`named`); None for a model's own file or folder (a GGUF, an HF folder)."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return path
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "config.json")):
        return None
    up = os.path.dirname(path) if best_alias(path) or os.path.basename(path).isdigit() else path
    checkpoints = os.path.basename(up) == "checkpoints" and os.path.isdir(up)
    return os.path.dirname(up) if checkpoints else None


def best_alias(path: str) -> bool:
    """Whether `path` names a run's best step (`.../checkpoints/best`, a name, no file)."""
    path = os.path.abspath(path)
    return os.path.basename(path) == "best" and os.path.basename(os.path.dirname(path)) == (
        "checkpoints"
    )


def named(path: str, step: int = 0, step_key: str = "eval.step") -> tuple[str, int]:
    """(the checkpoints folder, the step) named by a run directory, its checkpoints folder,
    one step's folder (`.../checkpoints/6`) or its best (`.../checkpoints/best`, by
    `train.best_metric`); `step` 0 = none named, the newest complete one is meant (the
    config field that gave it: `step_key`). No step's files are read (`locate`)."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if best_alias(path):
        best = read_best(parent)
        if best is None:
            raise ValueError(f"{path}: the run has no best checkpoint (train.best_metric)")
        path = os.path.join(parent, str(best["step"]))
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
    found = steps(folder)
    if not found:
        raise ValueError(f"{path}: no checkpoint (a run directory, its checkpoints/ or a step)")
    if step and step not in found:
        raise ValueError(f"{path}: no checkpoint of step {step} (there are {found})")
    return folder, step


def locate(path: str, step: int = 0, step_key: str = "eval.step") -> tuple[str, int]:
    """(the checkpoints folder, the step) that `path` names (`named`; `step` 0 = the newest
    complete one), its files checked: steps that do not match their digest are skipped
    (one line each); a damaged step named explicitly is refused."""
    folder, step = named(path, step, step_key)
    found = steps(folder)
    for s in [step] if step else reversed(found):
        problem = check_digest(folder, s)
        if problem in (None, NO_DIGEST):
            return folder, s
        if step:
            raise ValueError(f"{os.path.abspath(path)}: checkpoint {s} is damaged ({problem})")
        print(f"{folder}: checkpoint {s} is damaged ({problem}), skipped", file=sys.stderr)
    raise ValueError(f"{os.path.abspath(path)}: every checkpoint is damaged ({found})")


def fingerprint(folder: str, step: int) -> dict[str, list]:
    """{file: [size, SHA-256]} of a step's files: its digest (written when its write was
    seen to finish), or computed where it has none. What identifies the step's content."""
    try:
        with open(_digest_path(folder, step)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return _file_digests(os.path.join(folder, str(step)))


def restore_subset(path: str, step: int, like: dict) -> dict:
    """Only the parts of a saved train state that `like` names (e.g. {"state": {"params":
    ...}, "explorers": {...}}), into its shapes, dtypes and shardings: evaluation reads the
    params without allocating the optimizer's moments."""
    handlers = {"state": ocp.PyTreeCheckpointHandler(), "host": ocp.JsonCheckpointHandler()}
    manager = ocp.CheckpointManager(path, item_handlers=handlers)  # both: no "unknown item"
    try:
        saved = _leaves(manager.item_metadata(step)["state"])
        if not saved:  # Orbax reads a missing metadata file as an empty item
            raise ValueError(f"{path}/{step}: checkpoint damaged (its metadata is missing)")
        _check_matches(saved, _leaves(like), path, step)
    except BaseException:
        manager.close()
        raise
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    shardings = ocp.checkpoint_utils.construct_restore_args(abstract)  # `like`'s, not the file's
    args = ocp.args.Composite(
        state=ocp.args.PyTreeRestore(abstract, restore_args=shardings, partial_restore=True)
    )
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

"""What a process was doing when it failed, for the entry point's error boundary
(`explore_rl.main`): a failure while a run is set up is one line, `error: <what was being
done>: <problem>`. A set-up step names itself, and the file or setting it reads, with
`doing`; the loop's steps run inside `training`, where a failure keeps the loop's own
handling (checkpoint, then the error). Both mark the exception itself, so nothing is
left behind in the process between runs."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def doing(what: str):
    """`what` (e.g. "reading runs/x/config.json") is recorded on an exception raised
    inside, unless a step nested inside already named itself."""
    try:
        yield
    except Exception as e:
        if of(e) is None:
            e.doing = what
        raise


def of(error: BaseException) -> str | None:
    """What was being done when `error` was raised (`doing`), if a set-up step said."""
    return getattr(error, "doing", None)


@contextlib.contextmanager
def training():
    """A run's steps: an exception raised inside is a failure of training, not set-up."""
    try:
        yield
    except Exception as e:
        e.during_training = True
        raise


def during_training(error: BaseException) -> bool:
    return getattr(error, "during_training", False)


class Stopped(RuntimeError):
    """A run stopped by its own check (its updates diverged), said in one line."""

"""Small runs for the project's tests and for the author of a new method: a config's
`smoke` setting (the 2-layer random model with the embedded tokenizer: seconds a step),
a few steps, evaluation off, and a reward that gives a random model mixed groups, so every
step really updates (a real verifier gives a random model no correct answer, hence no
advantage and no update).

    from explore_rl import config, testing
    from explore_rl.train import loop

    c = testing.smoke("configs/eden.py:smoke", steps=3)
    progress = loop.train(config.spec(c), "runs/eden-test")  # metrics.jsonl, checkpoints

docs/adding_a_method.md uses it to test a new method end to end.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from explore_rl import config as config_lib

# `reward.fn` of the smoke runs: this module's `parity_of_length`
PARITY = "explore_rl.testing:parity_of_length"


def parity_of_length(response: str, problem) -> float:
    """1 for a response of odd length in characters: about half of a random model's
    responses, so its groups are mixed and their advantages non-zero."""
    return float(len(response) % 2)


def smoke(
    spec: str = "configs/grpo.py:smoke",
    steps: int = 3,
    methods: tuple[str, ...] | None = None,
    checkpoint_every: int = 2,
) -> ConfigDict:
    """The config of `spec` (`file.py[:arg]`, a smoke one) for `steps` steps, rewarded by
    `parity_of_length`, evaluation off, a checkpoint every `checkpoint_every` steps;
    `methods` replaces its `exploration.methods`."""
    c = config_lib.load(spec)
    c.reward.fn = PARITY
    c.train.steps, c.train.eval_every, c.train.checkpoint_every = steps, 0, checkpoint_every
    if methods is not None:
        c.exploration.methods = tuple(methods)
    return c


def start(c, workdir: str, verifier):
    """`build.start` of config `c` (or of a run spec already resolved, e.g. SFT's)
    as `loop.train` begins it, its explorers and mesh resolved too: for tests that drive a
    run's steps by hand."""
    from explore_rl.exploration import base as exploration
    from explore_rl.spec import RunSpec
    from explore_rl.train import build

    spec = c if isinstance(c, RunSpec) else config_lib.spec(c)
    mesh = spec.mesh.make()
    return build.start(spec, exploration.build(spec), workdir, verifier, mesh)

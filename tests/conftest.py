"""The suite's fixtures and hooks: how the test processes compile, the embedded model, the
sampler tests' tiny model. What test modules share besides fixtures is in helpers.py."""

import gc
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from helpers import FAST, FAST_COMPILE, FAST_XLA_OPTIONS, left_padded_batch  # noqa: E402

from explore_rl import caching  # noqa: E402
from explore_rl.models import presets, transformer  # noqa: E402

# The test processes read the compiled programs the CLI subprocesses write (and earlier runs
# of the suite), and write none themselves (`enable_compilation_cache`'s `write`).
caching.enable_compilation_cache(write=False)


# Most tests compile tiny models' programs and run each for milliseconds, so XLA's
# optimisation is much of the suite's time. The test processes compile with less of it:
# LLVM at level 0 (JAX's "compile less, run slower" switch) and, with it, XLA's older CPU
# fusion emitters (faster to compile, slower code) and each program's code in one LLVM
# module (XLA splits it into modules compiled in parallel, which costs a small program more
# than it saves: BENCHMARKS.md, "One LLVM module a program"), except for the tests marked
# `optimized`, which run SmolLM2-135M, where running is the time. An environment that sets
# JAX_DISABLE_MOST_OPTIMIZATIONS gets what it says: `make test-kernels` runs the float
# comparisons fully optimised, so three kinds of kernel are tested. The processes the tests
# start (the CLI, scripts, notebooks' kernels) compile likewise: `subprocess_env`.
def _with_fast_options(get_compile_options):
    def get(*args, **kwargs):
        options = get_compile_options(*args, **kwargs)
        if jax.config.read(FAST):
            options.env_option_overrides = [
                *options.env_option_overrides,
                *FAST_XLA_OPTIONS.items(),
            ]
        return options

    return get


try:  # JAX's own hook for compile options; in another JAX version only LLVM's level drops
    from jax._src import compiler as _compiler

    _compiler.get_compile_options = _with_fast_options(_compiler.get_compile_options)
except (ImportError, AttributeError):
    pass
if FAST_COMPILE:
    jax.config.update(FAST, True)


@pytest.fixture(scope="module")
def highest_precision():
    """Full-precision float32 matmuls for the modules that compare against a reference
    (`pytestmark = pytest.mark.usefixtures("highest_precision")`); scoped, so no module
    changes the precision of another at import."""
    import jax

    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(autouse=True)
def _optimized(request):
    """A test marked `optimized` compiles with XLA's full optimisation (see FAST_COMPILE)."""
    if not (FAST_COMPILE and request.node.get_closest_marker("optimized")):
        yield
        return
    jax.config.update(FAST, False)
    try:
        yield
    finally:
        jax.config.update(FAST, True)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """A worker drops its compiled programs after a module once it holds over a third of
    the mapped regions Linux allows a process (`vm.max_map_count`, 65,530 by default).
    XLA's CPU code is loaded as many small regions (about 6 a program, 60-70 for a
    sampler's) and a worker keeps every program it compiled: near the end of a whole-suite
    run a worker's next compile failed with "LLVM compilation error: Cannot allocate
    memory" (memory to spare) and the worker aborted, most likely at that limit. Dropping
    them after every module would cost the programs later modules share."""
    yield
    try:
        with open("/proc/self/maps") as f:
            regions = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except OSError:  # not Linux
        return
    if regions > limit // 3:
        jax.clear_caches()
        gc.collect()


@pytest.fixture(scope="session")
def embedded_gguf():
    from explore_rl.models import weights

    try:
        return weights.embedded_model_path()
    except ValueError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def embedded_model(embedded_gguf):
    from explore_rl.models import weights

    return weights.load(embedded_gguf)


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Qwen2 and Q = 3 left-padded prompts (`helpers.Q, G, T`), as params,
    cfg, tokens, mask; a module may define its own `tiny`."""
    cfg = presets.get_preset("tiny-qwen2")
    params = transformer.init_params(cfg, jax.random.key(1), scale=0.4)
    tokens, mask = left_padded_batch(np.random.default_rng(3), [7, 3, 5], 64, 8)
    return params, cfg, jnp.asarray(tokens), jnp.asarray(mask)

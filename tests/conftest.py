"""Shared fixtures: tiny random HF checkpoints of each family, the embedded GGUF, and
running the command line."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402

from explore_rl import caching  # noqa: E402
from explore_rl.models import transformer  # noqa: E402
from explore_rl.rl import train_step  # noqa: E402

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
FAST = "jax_disable_most_optimizations"
FAST_COMPILE = FAST.upper() not in os.environ
FAST_XLA_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_cpu_parallel_codegen_split_count": 1}


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

TINY_HF = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
)

# family -> (transformers config class name, extra config fields)
FAMILY_VARIANTS = {
    "llama": ("LlamaConfig", dict(rope_theta=10000.0, tie_word_embeddings=True)),
    "llama3-scaled": (
        "LlamaConfig",
        dict(
            rope_theta=10000.0,
            tie_word_embeddings=False,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "qwen2": ("Qwen2Config", dict(rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", dict(rope_theta=10000.0, tie_word_embeddings=True)),
}


def make_hf_checkpoint(folder, variant, seed: int = 0, max_shard_size=None):
    """Write a random tiny HF checkpoint (safetensors) and return the torch model.
    `variant`: a `FAMILY_VARIANTS` name, or (transformers config class name, its fields)."""
    import torch
    import transformers

    cls_name, extra = FAMILY_VARIANTS[variant] if isinstance(variant, str) else variant
    config = getattr(transformers, cls_name)(**TINY_HF, **extra)
    config.architectures = [cls_name.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # non-trivial norms and biases, so a missed one shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.eval()
    kw = {} if max_shard_size is None else dict(max_shard_size=max_shard_size)
    model.save_pretrained(folder, safe_serialization=True, **kw)
    return model


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


F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23: float32's rounding unit at 1


# `transformer.forward` as one compiled program, for a test's reference pass (op by op
# every op compiles for every shape: seconds a pass on 2 cores)
forward = jax.jit(transformer.forward, static_argnums=1)
# `train_step.score` likewise: op by op, its chunked log-probs (a `lax.map`) also compile
# anew at every call (a new closure each time)
score = jax.jit(train_step.score, static_argnums=1)


def assert_float32_close(actual, desired, *, scale=None, ulps=256, err_msg=""):
    """`actual` equals `desired` to float32 rounding of the magnitudes they came from.

    Two float32 computations of one quantity that differ in shape, order or batching (a
    batch of another width, a blockwise attention against a dense one, one micro-batch
    against several) do not round alike, and XLA picks kernels, vector widths and
    summation orders per shape *and per CPU*: the same pair of programs agrees to 1e-7 on
    one machine's AVX2 kernels and to 1e-5 on another's AVX-512 ones. What is machine
    independent is the size of the error relative to the values combined: a sum of n terms
    of size m is off by about sqrt(n) x eps x m, whatever the order. So the bound is
    `ulps` units of float32 rounding (eps = 2**-23) of `scale`, the magnitude of the
    values the result is computed from, plus as many of each element's own magnitude.
    `scale` defaults to the largest |desired| (right when the result is as large as its
    inputs: hidden states, logits); give it where the result is small against what it came
    from (a log-prob of -0.01 from logits of size 20: the logits' scale). `ulps` counts the
    rounding a computation may accumulate: 256 (~3e-5 relative) covers a few layers of a
    tiny model; deeper or longer chains say their own. An absolute tolerance alone bounds
    one machine's rounding; this bound holds on any.
    """
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    if scale is None:
        scale = float(np.max(np.abs(desired), initial=0.0))
    np.testing.assert_allclose(
        actual, desired, rtol=ulps * F32_EPS, atol=ulps * F32_EPS * scale, err_msg=err_msg
    )


def left_padded_batch(rng: np.random.Generator, lengths, vocab: int, total: int):
    """Random token rows of the given lengths, left-padded to `total` (pad id 0)."""
    tokens = np.zeros((len(lengths), total), np.int32)
    mask = np.zeros((len(lengths), total), bool)
    for i, n in enumerate(lengths):
        tokens[i, total - n :] = rng.integers(1, vocab, n)
        mask[i, total - n :] = True
    return tokens, mask


TESTS = os.path.dirname(os.path.abspath(__file__))


def subprocess_env(
    devices: int | None = None, tests_importable: bool = True, optimized: bool = False, **extra
):
    """The environment of a process a test starts (the CLI, a script, a notebook's kernel):
    this one's, on the CPU backend with `devices` CPU devices (one unless given: an
    inherited device count is dropped), the test modules importable (a custom `reward.fn`
    of a test), and `extra`'s variables.

    Under `make test` (FAST_COMPILE) it compiles as the test processes do, unless
    `optimized` (a process that runs SmolLM2-135M, where running is the time): less XLA
    optimisation, the older fusion emitters, one LLVM module a program. These processes
    run smoke-sized configs for a few steps, where XLA's compile is most of their time (a
    smoke run with an empty cache: 25 s of CPU fully optimised, 11 s so). What a user's run
    compiles is still tested: `make test-kernels` runs the float comparisons fully
    optimised, and the tests that measure a compiled program (the footprint's peak) or run
    as a user's install does (the wheel) start their processes with the environment as it
    is."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if FAST_COMPILE and not optimized:
        env[FAST.upper()] = "1"
        flags += [f"--{k}={str(v).lower()}" for k, v in FAST_XLA_OPTIONS.items()]
    env["XLA_FLAGS"] = " ".join(flags)
    if tests_importable:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    else:
        env.pop("PYTHONPATH", None)
    return env | extra


def run_main(*args, devices=None, timeout=600, cwd=None, env=None):
    """`python -m explore_rl.main ARGS` in a subprocess (`subprocess_env`: in `cwd`, with
    `devices` CPU devices and `env`'s variables too)."""
    return subprocess.run(
        [sys.executable, "-m", "explore_rl.main", *args],
        env=subprocess_env(devices, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )

"""What the test modules share besides fixtures (those are conftest.py's): tiny HF
checkpoints of each family, reference passes compiled once, float32 comparison, the
processes a test starts (the CLI, scripts), and the documentation pages' blocks. A test
module imports these from here, never from conftest.py or from another test module."""

import glob
import hashlib
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl.models import family, transformer
from explore_rl.rl import scoring

# The switch and XLA options with which the test processes compile tiny programs (conftest.py
# says why), and the processes they start too (`subprocess_env`).
FAST = "jax_disable_most_optimizations"
FAST_COMPILE = FAST.upper() not in os.environ
FAST_XLA_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_cpu_parallel_codegen_split_count": 1}


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

# a tiny checkpoint of each family (test_models.py checks every family of the package has
# one): variant -> (family name, its transformers config fields besides TINY_HF)
FAMILY_VARIANTS = {
    "llama": ("llama", dict(rope_theta=10000.0, tie_word_embeddings=True)),
    "llama3-scaled": (
        "llama",
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
    "qwen2": ("qwen2", dict(rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen3": ("qwen3", dict(rope_theta=10000.0, tie_word_embeddings=True)),
}


def make_hf_checkpoint(folder, variant, seed: int = 0, max_shard_size=None):
    """Write a random tiny HF checkpoint (safetensors) and return the torch model.
    `variant`: a `FAMILY_VARIANTS` name, or (a registered family's name, config fields)."""
    import torch
    import transformers

    name, extra = FAMILY_VARIANTS[variant] if isinstance(variant, str) else variant
    f = family.get(name)
    config = transformers.AutoConfig.for_model(f.hf_model_type or f.name, **TINY_HF, **extra)
    config.architectures = [f.hf_architecture]
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


def torch_logits(model, tokens, mask):
    import torch

    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.numpy()


F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23: float32's rounding unit at 1


# `transformer.forward` as one compiled program, for a test's reference pass (op by op
# every op compiles for every shape: seconds a pass on 2 cores)
forward = jax.jit(transformer.forward, static_argnums=1)
# `scoring.score` likewise: op by op, its chunked log-probs (a `lax.map`) also compile
# anew at every call (a new closure each time)
score = jax.jit(scoring.score, static_argnums=1)


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


def run_on_devices(script: str, devices: int) -> None:
    """`script` in a fresh Python process on `devices` CPU devices (JAX fixes its device
    count when it starts, so a mesh test needs its own process), the test modules
    importable; it prints "ok" once its checks pass."""
    out = subprocess.run(
        [sys.executable, "-c", script], env=subprocess_env(devices), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]


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


Q, G, T = 3, 4, 8  # the `tiny` fixture's prompts, rollouts per prompt, new tokens


def response_logits(params, cfg, prompt, pmask, tokens, rmask):
    """Logits that predict each response token, from one full forward per row (no cache)."""
    out = []
    for p, pm, r, rm in zip(*map(np.asarray, (prompt, pmask, tokens, rmask))):
        seq = np.concatenate([p[pm], r[rm]])
        x = jnp.asarray(seq)[None]
        logits = forward(params, cfg, x, jnp.arange(len(seq))[None], jnp.ones_like(x, bool)).logits[
            0
        ]
        n = int(pm.sum())
        row = np.zeros((r.shape[0], cfg.vocab_size), np.float32)
        row[: rm.sum()] = np.asarray(logits[n - 1 : n - 1 + rm.sum()])
        out.append(row)
    return np.stack(out)


def logit_scale(params, cfg, prompts, pmask, tokens, mask, temperature=1.0, interventions=None):
    """max |logit / tau| over the real response positions (greedy ones, tau 0, left out; 0
    when every one is greedy, so their log-probs compare exactly): the magnitude the rows'
    log-probs and entropies are computed from, and so the scale of their float32 rounding.
    One plain forward of each row's prompt (`prompts` [B, L], row b's own) and response;
    `interventions` steering only (appended slots are seen through a cache: they mix
    attention, and the final RMS norm keeps the logits' scale)."""
    seq = jnp.concatenate([jnp.asarray(prompts), jnp.asarray(tokens)], 1)
    seen = jnp.concatenate([jnp.asarray(pmask, bool), jnp.asarray(mask, bool)], 1)
    pos = transformer.positions_from_mask(seen)
    logits = forward(params, cfg, seq, pos, seen, None, interventions).logits
    n, t = prompts.shape[1], tokens.shape[1]
    z = np.abs(np.asarray(logits[:, n - 1 : n - 1 + t])).max(-1)  # predicts response token t
    tau = np.broadcast_to(np.asarray(temperature, np.float32), z.shape)
    live = np.asarray(mask, bool) & (tau > 0)
    return float((z[live] / tau[live]).max(initial=0.0))


def sampled_updates(params, cfg, mesh, prompts, pmask, group: int = 4, new: int = 6):
    """`group` rollouts of `new` tokens for each prompt, scored as pi_old, then two GRPO
    updates (two micro-batches each) on `mesh` with random advantages: (the samples, the
    sharded batch, the state after, the first update's metrics). The multi-device tests'
    one workload, run once on one device and once on a mesh."""
    from explore_rl import parallel
    from explore_rl.rl import losses
    from explore_rl.rl.train_step import Batch, OptimConfig, init_state, make_optimizer, train_step
    from explore_rl.sampling.sampler import SamplingConfig, sample

    b = prompts.shape[0] * group
    temps = jnp.ones((b, new))
    r = sample(params, cfg, prompts, pmask, jax.random.key(2), temps, SamplingConfig(new))
    old, _ = scoring.score(params, cfg, prompts, pmask, r.tokens, r.mask)
    adv = jax.random.normal(jax.random.key(3), (b,))
    batch = Batch(prompts, pmask, r.tokens, r.mask, adv, r.logprobs, old, jnp.ones(b))
    batch = parallel.shard_batch(batch, mesh)
    oc, lc = OptimConfig(lr=1e-3, micro_batches=2), losses.LossConfig()
    opt = make_optimizer(oc)
    state = parallel.create(init_state, mesh, family.axes, jax.tree.map(jnp.copy, params), opt)
    state, m = train_step(state, batch, cfg, lc, oc, opt)
    state, _ = train_step(state, batch, cfg, lc, oc, opt)
    return r, batch, state, m


def log_softmax(z):
    """NumPy's log-softmax over the last axis, for reference log-probs."""
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def reference_truncated_logprob(logits, tau, top_p, top_k):
    """log q of every token: temperature, then top-k, then top-p of the renormalised rest."""
    z = logits / tau
    order = np.argsort(-z, kind="stable")
    p = np.exp(log_softmax(z))[order]
    keep = np.ones_like(p, bool) if top_k == 0 else np.arange(len(p)) < top_k
    pk = np.where(keep, p, 0) / np.where(keep, p, 0).sum()
    keep &= np.cumsum(pk) - pk < top_p
    q = np.full(len(p), -np.inf)
    q[order[keep]] = np.log(p[keep] / p[keep].sum())
    return q


def snapshot(folder) -> dict:
    """{path under `folder`: sha256 of its bytes} of every file: whether a run changed it."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def without_timing(rows):
    """Metrics rows without their timings (`time/*`, `perf/*`), which no rerun repeats."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
    if not p.endswith("adding_a_method.md")
)


def page_blocks(lang: str, pages: list[str] = PAGES) -> list[str]:
    """The pages' ``` blocks of one language: "" the shell, "python", "text" (not run)."""
    blocks = []
    for page in pages:
        with open(os.path.join(ROOT, page)) as f:
            lines = f.read().splitlines()
        current = None
        for line in lines:
            if line.startswith("```"):
                if current is None:
                    current = [line[3:].strip()]
                else:
                    if current[0] == lang:
                        blocks.append("\n".join(current[1:]) + "\n")
                    current = None
            elif current is not None:
                current.append(line)
    return blocks


def _config_at_smoke_scale(spec: str) -> str:
    """configs/x.py[:parts] -> the same variant at smoke scale (base.py has no scales)."""
    path, _, arg = spec.partition(":")
    if path.endswith("base.py"):
        return spec
    parts = [p for p in arg.split(",") if p and p not in ("smoke", "demo", "lab", "paper")]
    return f"{path}:{','.join(parts + ['smoke'])}"


def smoke(words: list[str], hf_folder: str) -> list[str]:
    """A command of the pages at the smallest size that still does what it says."""
    if words[:1] == ["make"]:
        return ["make", "-n", "-C", ROOT, *words[1:]]
    out = []
    for w in words:
        if w.startswith("configs/") and ".py" in w:
            w = _config_at_smoke_scale(w)
        elif w.startswith("--config.model.path=/"):
            w = f"--config.model.path={hf_folder}"
        out.append(w)
    if out[0] == "python":
        out[0] = sys.executable
    if out[0] == "explore-rl":  # the command an install puts beside its Python
        out[0] = os.path.join(os.path.dirname(sys.executable), "explore-rl")
    if "--mode" in out and out[out.index("--mode") + 1] == "sample":
        out += ["--config.sample.num_prompts=2", "--config.sample.max_new_tokens=8"]
    if out[1:3] == ["-m", "explore_rl.bench"]:
        out += {
            "forward": ["--random-init", "tiny-llama", "--batch", "2", "--length", "16"],
            "sample": ["--random-init", "tiny-llama", "--reps", "1", "--no-peer"],
            "startup": ["--config", "configs/grpo.py:smoke"],
            "memory": ["--config", "configs/grpo.py:smoke"],
            "lora": ["--config", "configs/grpo.py:smoke", "--steps", "1", "--ranks", "1"],
            "fit": [],  # shapes only: every paper config as it is
            "depth": [
                "--preset",
                "tiny-llama",
                "--layers",
                "1",
                "--length",
                "4",
                "--prompt-len",
                "4",
                "--dtype",
                "float32",
            ],  # fmt: skip
            "lab": [
                "--config",
                "configs/lab.py:smoke",
                "--samples",
                "4",
                "--group",
                "2",
                "--rl-steps",
                "1",
            ],  # fmt: skip
            "long": [
                "--preset",
                "tiny-llama",
                "--layers",
                "1",
                "--prompt-len",
                "8",
                "--lengths",
                "64,128",
                "--dense-max",
                "64",
                "--reps",
                "1",
            ],  # fmt: skip
            "engine": [
                "--random-init",
                "tiny-llama",
                "--prompts",
                "2",
                "--group",
                "2",
                "--new-tokens",
                "8",
                "--slots",
                "0,3",
            ],  # fmt: skip
            "scale": [
                "--presets",
                "tiny-qwen2",
                "--dtype",
                "float32",
                "--prompts",
                "2",
                "--group",
                "2",
                "--prompt-len",
                "8",
                "--new-tokens",
                "4",
                "--micro-batches",
                "1",
            ],
        }[out[3]]
    if out[1:3] == ["-m", "explore_rl.eden_analysis"]:
        out += ["--prompts=2", "--samples=2"]
    return out

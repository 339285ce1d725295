"""The device and what its JAX can do, as one JSON line: the first step of
`results/gpu.sh`. Fails (an import error naming the package) where the project's
dependencies are missing; says whether cuDNN's fused attention runs in bfloat16 (forward
and gradient) and whether `model.attention=auto` picks it; measures the limits the other
steps divide by (the bfloat16 matmul peak, the memory bandwidth).

    python results/tools/gpu_device.py
"""

import importlib.metadata
import json
import platform

import jax
import jax.numpy as jnp

from explore_rl.bench.common import matmul_peak, memory_bandwidth
from explore_rl.models import attention

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml-collections", "tokenizers")


def fused_kernel() -> str:
    """'ok', or the error of one cuDNN attention call and its gradient in bfloat16."""
    q = jax.random.normal(jax.random.key(0), (2, 256, 4, 128), jnp.bfloat16)
    k = jax.random.normal(jax.random.key(1), (2, 256, 2, 128), jnp.bfloat16)

    def loss(q):
        out = jax.nn.dot_product_attention(q, k, k, is_causal=True, implementation="cudnn")
        return jnp.sum(out.astype(jnp.float32))

    try:
        jax.block_until_ready(jax.jit(jax.value_and_grad(loss))(q))
        return "ok"
    except Exception as e:  # any failure is the answer: which, in a line
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def main() -> dict:
    device = jax.devices()[0]
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    result = {
        "bench": "device",
        "device": device.device_kind,
        "devices": jax.device_count(),
        "python": platform.python_version(),
        "versions": versions,
        "fused_kernel": fused_kernel(),
        "auto_picks_fused": attention.uses_fused("auto", jnp.bfloat16, 128),
        "bf16_matmul_tflops": round(matmul_peak("bfloat16") / 1e12, 1),
        "bandwidth_gbs": round(memory_bandwidth() / 1e9, 1),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

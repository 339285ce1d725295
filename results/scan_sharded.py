"""XLA's temporaries a device for the update's gradient on 8 fake CPU devices (mesh fsdp
8), the layers unrolled against scanned (`model.scan_layers`): does the scan's stacked copy
of the weights stay sharded as the layers are? BENCHMARKS.md, "Scanned layers".

    python results/scan_sharded.py
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from explore_rl import parallel  # noqa: E402
from explore_rl.models import family, presets, transformer  # noqa: E402
from explore_rl.rl import footprint, losses  # noqa: E402
from explore_rl.rl.train_step import Batch, _loss  # noqa: E402

MIB = 2**20


def main() -> None:
    mesh = parallel.make_mesh(data=1, fsdp=8, tensor=1)
    q, g, prompt_len, t = 8, 2, 32, 64
    for scan in (False, True):
        cfg = presets.get_preset(
            "smollm2-135m", n_layers=8, remat="block", logits_chunk=128, scan_layers=scan,
            param_dtype="bfloat16", dtype="bfloat16",
        )  # fmt: skip
        with parallel.use(mesh):
            init = jax.jit(lambda k, c=cfg: transformer.init_params(c, k))
            params = parallel.place(init(jax.random.key(0)), mesh, family.axes)
            rows, tokens = jnp.ones((q * g, t), jnp.int32), jnp.ones((q * g, t), bool)
            logp = -jnp.ones((q * g, t))
            batch = Batch(
                jnp.ones((q, prompt_len), jnp.int32), jnp.ones((q, prompt_len), bool), rows,
                tokens, jnp.ones(q * g), logp, logp, jnp.ones(q * g),
            )  # fmt: skip
            batch = parallel.shard_batch(batch, mesh)
            grad = jax.jit(
                jax.grad(
                    lambda p, b, c=cfg: _loss(p, c, losses.LossConfig(), b, jnp.float32(q * g * t))[
                        0
                    ]
                )
            )
            temp = grad.lower(params, batch).compile().memory_analysis().temp_size_in_bytes
        layers = footprint.per_device_bytes(
            jax.eval_shape(lambda c=cfg: transformer.init_params(c, jax.random.key(0)))["layers"],
            dict(mesh.shape),
        )
        print(
            f"{'scanned' if scan else 'unrolled'}: XLA temporaries {temp / MIB:.1f} MiB a "
            f"device; the layers' weights {layers / MIB:.1f} MiB a device "
            f"({layers * 8 / MIB:.1f} whole)"
        )


if __name__ == "__main__":
    main()

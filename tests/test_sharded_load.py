"""Loading places each tensor with the requested sharding (4 fake CPU devices)."""

import os
import subprocess
import sys
import textwrap

from conftest import make_hf_checkpoint

SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from explore_rl.models import weights
    assert jax.device_count() == 4
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
    placed = []
    def place(path, w):
        # shard the largest axis over fsdp when it divides, else replicate
        axis = int(np.argmax(w.shape))
        spec = [None] * w.ndim
        if w.shape[axis] % 2 == 0:
            spec[axis] = "fsdp"
        placed.append(path)
        return jax.device_put(w, NamedSharding(mesh, P(*spec)))
    sharded, cfg = weights.load_hf(sys.argv[1], place)
    plain, _ = weights.load_hf(sys.argv[1])
    q = sharded["layers"][1]["q"]
    assert q.sharding.spec == P("fsdp", None, None), q.sharding
    assert len(q.addressable_shards) == 4 and q.addressable_shards[0].data.shape == (16, 4, 8)
    assert len(placed) == len(jax.tree.leaves(plain))
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    print("ok")
""")


def test_load_with_target_sharding(tmp_path):
    make_hf_checkpoint(tmp_path, "qwen2")
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]

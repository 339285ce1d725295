"""Loading places each tensor on the sharding rules, reading one device's slice at a time
(8 fake CPU devices)."""

import subprocess
import sys
import textwrap

import pytest
from helpers import make_hf_checkpoint, subprocess_env

pytestmark = pytest.mark.slow  # a process of 8 CPU devices

SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from explore_rl import parallel
    from explore_rl.models import family, weights
    assert jax.device_count() == 8
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    put, read = parallel.placer(mesh, family.axes), {}

    class Seen:  # the memory-mapped tensor, noting what part of it each read takes
        def __init__(self, path, w):
            self.path, self.w, self.shape = path, w, w.shape

        def __getitem__(self, index):
            read.setdefault(self.path, []).append(self.w[index].size / self.w.size)
            return self.w[index]

    place = lambda path, w, dtype: put(path, Seen(path, w), dtype)
    sharded, cfg = weights.load_hf(sys.argv[1], place)
    plain, _ = weights.load_hf(sys.argv[1])
    q = sharded["layers"][1]["q"]
    assert q.sharding.spec == P("fsdp", "tensor", None), q.sharding
    assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (16, 2, 8)
    # each distinct slice is read and cast once, alone (not the whole tensor, and not again
    # for its data-axis replica): a host of a multi-host run reads only its devices' slices
    q_reads, down_reads, norm_reads = (read[("layers", 1, n)] for n in ("q", "down", "attn_norm"))
    assert q_reads == down_reads == read[("embed",)] == [0.25] * 4, read
    assert norm_reads == [1.0], read  # replicated: read whole, once
    tensors = {("layers", 1, n): x for n, x in sharded["layers"][1].items()}
    tensors.update({(n,): sharded[n] for n in ("embed", "final_norm")})
    for path, x in tensors.items():
        share = x.addressable_shards[0].data.size / x.size
        assert read[path] == [share] * round(1 / share), (path, read)
    # exact: the same stored values, only placed differently
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    print("ok")
""")


def test_load_with_target_sharding(tmp_path):
    make_hf_checkpoint(tmp_path, "qwen2")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=subprocess_env(8),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]

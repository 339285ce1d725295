"""Device mesh and sharding rules: the one place that decides where arrays live.

A 2-D mesh ('data', 'fsdp'): parameters and optimizer state are sharded over 'fsdp'
(each along its largest dimension that divides evenly, replicated otherwise; `RULES` can
pin a parameter name to a dimension), batches over both axes together. On one device
every sharding degenerates to replicated with no change to the calling code.

Several processes (hosts) form one run through JAX's multi-controller runtime:
`initialize` joins them (`jax.distributed`), after which `jax.devices()` and the mesh span
every process's devices and each process runs the same program on its own devices.

    initialize("10.0.0.1:1234", num_processes=2, process_id=0)  # before any device use
    mesh = make_mesh(data=2, fsdp=2)
    params = jax.device_put(params, param_shardings(params, mesh))
"""

from __future__ import annotations

import math
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

BATCH_AXES = ("data", "fsdp")

# Parameter name -> the dimension to shard over 'fsdp' (others: the largest that divides).
# Embeddings shard over the vocabulary, projections over their model-dimension input.
RULES = {"embed": 0, "lm_head": 1, "q": 0, "k": 0, "v": 0, "o": 2, "gate": 0, "up": 0, "down": 1}


def _launched_as_several() -> bool:
    """srun or mpirun started several processes (JAX reads the rest from their variables)."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("OMPI_COMM_WORLD_SIZE")
    return int(tasks or 1) > 1


def initialize(
    coordinator: str = "", num_processes: int = 1, process_id: int = 0, detect: bool = False
) -> None:
    """Join the run's processes before any device is used: explicitly (process 0's
    host:port, the process count, this process's index), or from the cluster's own
    variables (`detect`, e.g. every worker of a TPU pod; SLURM's srun and Open MPI's
    mpirun with several tasks are recognised without it). One plain process: nothing."""
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(
            f"--process_id={process_id} must be in [0, --num_processes={num_processes})"
        )
    if num_processes > 1:
        if not coordinator:
            raise ValueError(f"--num_processes={num_processes} needs --coordinator=HOST:PORT")
        jax.distributed.initialize(coordinator, num_processes, process_id)
    elif detect or _launched_as_several():
        jax.distributed.initialize()


def is_main_process() -> bool:
    """The process that writes the run's logs, samples and reports."""
    return jax.process_index() == 0


def make_mesh(data: int = 1, fsdp: int = -1, devices=None) -> Mesh:
    """A ('data', 'fsdp') mesh; -1 for fsdp takes the devices data leaves."""
    devices = np.asarray(devices if devices is not None else jax.devices())
    if data < 1 or (fsdp == -1 and devices.size % data):
        raise ValueError(f"mesh.data={data}: must divide the {devices.size} devices present")
    if fsdp == -1:
        fsdp = devices.size // data
    if data * fsdp != devices.size:
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} needs {data * fsdp} devices, "
            f"{devices.size} are present"
        )
    return Mesh(devices.reshape(data, fsdp), BATCH_AXES)


def _spec(name: str, shape: tuple[int, ...], fsdp: int) -> PartitionSpec:
    if fsdp == 1 or not shape:
        return PartitionSpec()
    dims = [RULES[name]] if name in RULES else sorted(range(len(shape)), key=lambda d: -shape[d])
    for d in dims:
        if d < len(shape) and shape[d] % fsdp == 0:
            spec = [None] * len(shape)
            spec[d] = "fsdp"
            return PartitionSpec(*spec)
    return PartitionSpec()


def param_shardings(tree, mesh: Mesh):
    """NamedShardings for a params (or optimizer-state) pytree, by leaf name and shape."""
    fsdp = mesh.shape["fsdp"]

    def leaf(path, x):
        name = next((p.key for p in reversed(path) if hasattr(p, "key")), "")
        return NamedSharding(mesh, _spec(str(name), tuple(np.shape(x)), fsdp))

    return jax.tree_util.tree_map_with_path(leaf, tree)


def place(tree, mesh: Mesh):
    """`tree` (params, optimizer state, a run's progress) on its `param_shardings`. In a run
    of several processes a value made on this process alone (an eager `jnp.zeros`, a
    counter) goes through the host first: each process holds the same value, and JAX
    builds the global array from it."""
    shardings = param_shardings(tree, mesh)
    if jax.process_count() > 1:
        local = lambda x: isinstance(x, jax.Array) and len(x.sharding.device_set) == 1  # noqa: E731
        tree = jax.tree.map(lambda x: np.asarray(x) if local(x) else x, tree)
    return jax.device_put(tree, shardings)


def placer(mesh: Mesh):
    """A `place(path, array)` for the weight loaders: each tensor goes straight to its
    shards as it is read, so no host ever holds the whole model twice."""
    fsdp = mesh.shape["fsdp"]

    def place(path: tuple, w: np.ndarray) -> jax.Array:
        return jax.device_put(w, NamedSharding(mesh, _spec(str(path[-1]), w.shape, fsdp)))

    return place


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (row) axis over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def shard_batch(tree, mesh: Mesh):
    """Place every array of a batch pytree row-sharded (rows must divide the mesh size)."""
    size = math.prod(mesh.shape.values())

    def put(x):
        if np.ndim(x) == 0 or np.shape(x)[0] % size:
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
        return jax.device_put(x, batch_sharding(mesh, np.ndim(x)))

    return jax.tree.map(put, tree)

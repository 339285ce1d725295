"""Device mesh and sharding rules: the one place that decides where arrays live.

A 3-D mesh ('data', 'fsdp', 'tensor'). Every array dimension has a logical name, and one
table maps logical names to mesh axes (`RULES`): rows of a batch over data x fsdp, the
model dimension of every weight over fsdp (ZeRO-3-style: gathered for use, its gradient
and optimizer moments stay sharded), and over tensor the vocabulary, the attention heads
and the MLP's hidden dimension (Megatron-style). Each weight's dimensions are named by its
model family: the functions that place weights take that lookup as `axes`
(`models.family.axes`), so this base module imports no model. Norms and anything else
small are replicated. A dimension that the axis size does not divide is replicated over
that axis. On one device every sharding degenerates to replicated with no change to the
calling code.

Inside jitted code, `constrain(x, "batch", None, "heads", None)` pins an activation to
the rules on the mesh of `use(mesh)` (a no-op without one, or on one device).

Several processes (hosts) form one run through JAX's multi-controller runtime:
`initialize` joins them (`jax.distributed`), after which `jax.devices()` and the mesh span
every process's devices and each process runs the same program on its own devices.

    initialize("10.0.0.1:1234", num_processes=2, process_id=0)  # before any device use
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    params = place(params, mesh, family.axes)
    with use(mesh):
        ...  # jitted calls: activations constrained, outputs on the rules
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# A weight's name -> the logical name of each of its dimensions, None: no family has it
# (`models.family.axes`).
Axes = Callable[[str], tuple | None]

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical dimension -> mesh axes (anything not named here is replicated).
RULES = {
    "batch": BATCH_AXES,
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
}


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


def allgather_bytes(data: bytes) -> list[bytes]:
    """Every process's `data`, in process order (host data such as a step's problems; a
    collective: every process calls it alike). One process: `[data]`, nothing sent."""
    if jax.process_count() == 1:
        return [data]
    from jax.experimental import multihost_utils

    sizes = np.asarray(multihost_utils.process_allgather(np.int64(len(data))))
    buffer = np.zeros(int(sizes.max()), np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    every = np.asarray(multihost_utils.process_allgather(buffer))
    return [every[p, :n].tobytes() for p, n in enumerate(sizes)]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh; -1 for fsdp takes the devices the others leave."""
    devices = np.asarray(devices if devices is not None else jax.devices())
    if data < 1 or devices.size % data:
        raise ValueError(f"mesh.data={data}: must divide the {devices.size} devices present")
    if tensor < 1 or devices.size % (data * tensor):
        raise ValueError(
            f"mesh.tensor={tensor}: mesh.data x mesh.tensor must divide the {devices.size} "
            "devices present"
        )
    if fsdp == -1:
        fsdp = devices.size // (data * tensor)
    if data * fsdp * tensor != devices.size:
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {data * fsdp * tensor} "
            f"devices, {devices.size} are present"
        )
    return Mesh(devices.reshape(data, fsdp, tensor), AXES)


def use(mesh: Mesh):
    """The context in which jitted code sees `mesh` (for `constrain`); nothing on one
    device, so a one-device program is the same with or without a mesh."""
    return jax.set_mesh(mesh) if mesh.size > 1 else contextlib.nullcontext()


def logical_spec(names, shape, axis_sizes) -> PartitionSpec:
    """The `RULES` spec for dimensions named `names` (None: replicated), dropping a mesh
    axis that does not divide its dimension or that an earlier dimension already uses."""
    spec, used = [], set()
    for name, size in zip(names, shape, strict=True):
        axes = RULES.get(name, ())
        axes = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if a not in used)
        axes = tuple(a for a in axes if axis_sizes.get(a, 1) > 1)
        if axes and size % math.prod(axis_sizes[a] for a in axes):
            axes = ()
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else (axes or None))
    return PartitionSpec(*spec)


def _axis_sizes() -> dict | None:
    """The axis sizes of `use(mesh)`'s mesh while tracing, None without one of several
    devices (then constraints are left out, and a program is the one-device program)."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or mesh.size == 1 else dict(mesh.shape)


def batch_shards(mesh: Mesh | dict | None = None) -> int:
    """The devices a batch's rows are split over: data x fsdp of `mesh` (or of its axis
    sizes, a dict), else of the mesh in use (`use`), else 1."""
    if mesh is None:
        sizes = _axis_sizes() or {}
    else:
        sizes = mesh if isinstance(mesh, dict) else dict(mesh.shape)
    return math.prod(sizes.get(a, 1) for a in BATCH_AXES)


def constrain(x, *names):
    """`x` on the rules for its dimensions' logical names, inside jitted code under
    `use(mesh)`; unchanged without a mesh of several devices."""
    sizes = _axis_sizes()
    if sizes is None:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, sizes))


def replicated(tree):
    """Every array of `tree` whole on every device, inside jitted code under `use(mesh)`:
    what a program returns for the host to read (a rollout's rows, decoded on their
    devices, gathered for scoring; in a run of several processes a host can read only
    what its own devices hold)."""
    if _axis_sizes() is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, PartitionSpec()), tree)


def _fallback(shape: tuple[int, ...], fsdp: int) -> PartitionSpec:
    """An array the table does not name (a parameter a method adds, a moment of one): over
    fsdp along its largest dimension that divides, replicated if none does."""
    for d in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if fsdp > 1 and shape[d] % fsdp == 0:
            return PartitionSpec(*[("fsdp" if i == d else None) for i in range(len(shape))])
    return PartitionSpec()


def spec(name: str, shape: tuple[int, ...], axis_sizes, axes: Axes) -> PartitionSpec:
    """The spec of a parameter (or its optimizer moment) by its name and shape: the axes
    its model family declares for it (`axes(name)`), else `_fallback`."""
    if not shape:
        return PartitionSpec()
    names = axes(name)
    if names is not None and len(names) == len(shape):  # a norm: () as any replicated leaf
        return logical_spec(names, shape, axis_sizes) if any(names) else PartitionSpec()
    return _fallback(shape, axis_sizes.get("fsdp", 1))


def leaf_name(path) -> str:
    """A leaf's parameter name: its innermost dict key ("q" of layers/3/q, or of a moment)."""
    return str(next((p.key for p in reversed(path) if hasattr(p, "key")), ""))


def param_shardings(tree, mesh: Mesh, axes: Axes):
    """NamedShardings for a params (or optimizer-state) pytree, by leaf name and shape."""
    sizes = dict(mesh.shape)

    def leaf(path, x):
        return NamedSharding(mesh, spec(leaf_name(path), tuple(np.shape(x)), sizes, axes))

    return jax.tree_util.tree_map_with_path(leaf, tree)


def constrain_params(tree, axes: Axes):
    """A params (or optimizer-state) pytree pinned to `param_shardings` inside jitted
    code under `use(mesh)`: how an update declares where its new state lives."""
    sizes = _axis_sizes()
    if sizes is None:
        return tree

    def leaf(path, x):
        return jax.lax.with_sharding_constraint(x, spec(leaf_name(path), x.shape, sizes, axes))

    return jax.tree_util.tree_map_with_path(leaf, tree)


def create(fn, mesh: Mesh, axes: Axes, tree, *static):
    """`fn(tree, *static)` (the train state's init) computed straight into its
    `param_shardings`: nothing (the optimizer's moments) is made whole on one device and
    moved afterwards. `tree` is donated: its buffers become the output's."""
    init = lambda t: fn(t, *static)  # noqa: E731
    out = param_shardings(jax.eval_shape(init, tree), mesh, axes)
    return jax.jit(init, donate_argnums=0, out_shardings=out)(tree)


def _global(tree):
    """In a run of several processes a value made on this process alone (an eager
    `jnp.zeros`, a counter) goes through the host first: each process holds the same value,
    and JAX builds the global array from it."""
    if jax.process_count() == 1:
        return tree
    local = lambda x: isinstance(x, jax.Array) and len(x.sharding.device_set) == 1  # noqa: E731
    return jax.tree.map(lambda x: np.asarray(x) if local(x) else x, tree)


def place(tree, mesh: Mesh, axes: Axes):
    """`tree` (params, optimizer state) on its `param_shardings`."""
    return jax.device_put(_global(tree), param_shardings(tree, mesh, axes))


def replicate(tree, mesh: Mesh):
    """`tree` whole on every device of `mesh`: what each host reads back (an explorer's
    bank; in a run of several processes a host can read only its own devices)."""
    return jax.device_put(_global(tree), NamedSharding(mesh, PartitionSpec()))


def placer(mesh: Mesh, axes: Axes):
    """A `place(path, array, dtype)` for the weight loaders: each tensor goes straight to
    its shards as it is read, and a host casts and holds only its own devices' slices of
    it (a slice across a tensor's inner dimension still touches most of its pages in the
    file: the page cache reads them, the host keeps only the slice)."""
    sizes = dict(mesh.shape)

    def put(path: tuple, w, dtype) -> jax.Array:
        sharding = NamedSharding(mesh, spec(str(path[-1]), w.shape, sizes, axes))
        if isinstance(w, jax.Array):  # already on a device (random weights)
            return jax.device_put(w.astype(dtype), sharding)
        slices = {}  # a slice is read once, however many devices hold it (data replicas)

        def read(index):
            key = tuple((s.start, s.stop, s.step) for s in index)
            if key not in slices:
                slices[key] = np.asarray(w[index], dtype=dtype)
            return slices[key]

        return jax.make_array_from_callback(w.shape, sharding, read)

    return put


def shard_batch(tree, mesh: Mesh):
    """Place every array of a batch pytree with its rows over data x fsdp (replicated over
    tensor); an array whose rows the batch axes do not divide is replicated."""
    sizes = dict(mesh.shape)

    def put(x):
        names = ("batch", *[None] * (np.ndim(x) - 1)) if np.ndim(x) else ()
        return jax.device_put(x, NamedSharding(mesh, logical_spec(names, np.shape(x), sizes)))

    return jax.tree.map(put, tree)

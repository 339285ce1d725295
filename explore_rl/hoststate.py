"""State that is not a fixed-shape array: Python data an explorer keeps between steps
(per-problem memories, a queue of guided prompts), inside its otherwise array state.

`HostState` is a pytree node without leaves: JAX passes it through tree operations
(device_put, sharding, Orbax's array save) untouched, and the checkpointer writes its data
as JSON beside the arrays of the same step (`checkpoint.py`). Treat it as immutable:
return a new `HostState` with new data from `shape_advantages`, as with arrays.

    state = {"counts": jnp.zeros(3), "memory": HostState({"problem-id": [0.1, 0.2]})}
"""

from __future__ import annotations

from typing import Any

import jax


class HostState:
    def __init__(self, data: Any = None):
        self.data = {} if data is None else data  # JSON-able: dicts, lists, str, numbers

    def __repr__(self) -> str:
        return f"HostState({self.data!r})"


# No children; the object itself is the aux data, so every tree operation keeps it.
jax.tree_util.register_pytree_node(HostState, lambda h: ((), h), lambda h, _: h)


def host_states(tree) -> dict[str, HostState]:
    """Every HostState in `tree`, by its key path ("explorers/extra/memory")."""
    found = {}

    def visit(path, node):
        if isinstance(node, HostState):
            found["/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)] = node
        return node

    jax.tree_util.tree_map_with_path(visit, tree, is_leaf=lambda x: isinstance(x, HostState))
    return found

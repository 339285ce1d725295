"""The package's imports flow one way: each module imports only modules of its own layer or
of the layers below it, no module imports itself back through others, and neither does a
package (`explore_rl/<package>/` or a top-level module) through another (DESIGN.md,
"Architecture"). The core is layered too, in order. Every import counts, those inside
functions too. A new module must be placed in `LAYERS`, so where it sits is a decision,
not an accident."""

import ast
import pathlib
import shutil

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "explore_rl"

# Lowest first. A module belongs to the layer of the longest prefix that names it. The core
# (the model, sampling, answers, data, rewards, scoring and losses: no loop, no method) is
# the first seven, each importing only those before it.
LAYERS = (
    ("core/base", ("registry", "parallel", "caching", "memory", "logs", "hoststate",
                   "checkpoint", "stages")),
    ("core/models", ("models",)),  # families, the decoder, attention, loading, tokenizers
    ("core/sampling", ("sampling",)),  # batch shapes, the sampler and the slot engine
    ("core/answers", ("answers",)),  # the answer a text states
    ("core/data", ("data",)),
    ("core/rewards", ("rewards",)),
    # advantages, losses, scoring, the update, rollouts and their metrics, the memory model
    ("core/rl", ("rl", "evaluation.metrics")),
    ("contract", ("exploration.base", "spec")),  # what the loop and the methods both depend on
    ("methods", ("exploration",)),  # one module per exploration method
    # the config -> the run spec, the GRPO loop, held-out evaluation and its measures
    ("loop", ("config", "train", "evaluation.evaluate", "evaluation.diversity")),
    ("modes", ("main", "modes")),  # one module per --mode; main parses and dispatches
    ("tools", ("bench", "analysis", "eden_analysis", "testing")),
)  # fmt: skip


def layer_of(module: str) -> int:
    best = max(
        ((len(p), i) for i, (_, ps) in enumerate(LAYERS) for p in ps
         if module == p or module.startswith(p + ".")),
        default=None,
    )  # fmt: skip
    if best is None:
        raise KeyError(f"{module}: in no layer of LAYERS (tests/test_layering.py): place it")
    return best[1]


def package_imports(root: pathlib.Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, names relative to the package."""
    paths = {}
    for p in root.rglob("*.py"):
        imports = any(
            isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(ast.parse(p.read_text()))
        )
        if p.name == "__init__.py" and not imports:
            continue  # a package marker (empty, or its docstring and version) is in no layer
        parts = p.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        paths[name] = p
    graph = {}
    for name, p in paths.items():
        here = name.split(".") if p.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    prefix = here[: len(here) - node.level + 1]
                    base = ".".join(prefix + ([base] if base else []))
                elif base == root.name or base.startswith(root.name + "."):
                    base = base[len(root.name) + 1 :]
                else:
                    continue
                # `from pkg import module` imports the module; `from module import name` the module
                targets = [f"{base}.{a.name}".strip(".") for a in node.names]
                targets = [t if t in paths else base for t in targets]
            else:
                continue
            for t in targets:
                t = t[len(root.name) + 1 :] if t.startswith(root.name + ".") else t
                if t in paths and t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The members of each cycle, sorted: the strongly connected components (Tarjan) of
    more than one node."""
    index, low, stack, found = {}, {}, [], []

    def visit(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in graph.get(m, ()):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:  # m is the first of its component met: pop the component
            members = stack[stack.index(m) :]
            del stack[stack.index(m) :]
            if len(members) > 1:
                found.append(sorted(members))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(found)


def packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph's arrows between packages: `explore_rl/<package>/` or a top-level
    module, by its first name."""
    out = {}
    for m, deps in graph.items():
        out.setdefault(m.split(".")[0], set()).update(
            d.split(".")[0] for d in deps if d.split(".")[0] != m.split(".")[0]
        )
    return out


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Arrows that run up a layer, cycles of modules and cycles of packages."""
    return (
        [
            f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
            for m, deps in sorted(graph.items())
            for d in sorted(deps)
            if layer_of(d) > layer_of(m)
        ]
        + ["cycle: " + ", ".join(c) for c in cycles(graph)]
        + ["package cycle: " + ", ".join(c) for c in cycles(packages(graph))]
    )


def test_every_module_is_in_a_layer():
    for module in package_imports(PACKAGE):
        layer_of(module)


def test_imports_flow_one_way_and_close_no_cycle():
    assert violations(package_imports(PACKAGE)) == []


@pytest.mark.parametrize(
    "graph,found",
    [
        ({"rl.plan": {"train.loop"}, "train.loop": set()},
         ["rl.plan (core/rl) imports train.loop (loop)"]),
        ({"exploration.base": {"exploration.ead"}, "exploration.ead": set()},
         ["exploration.base (contract) imports exploration.ead (methods)"]),
        ({"models.a": {"models.b"}, "models.b": {"models.a"}}, ["cycle: models.a, models.b"]),
        # one arrow up the core's order, closing a cycle of packages and none of modules
        ({"models.a": {"sampling.b"}, "sampling.b": set(), "sampling.c": {"models.d"},
          "models.d": set()},
         ["models.a (core/models) imports sampling.b (core/sampling)",
          "package cycle: models, sampling"]),
    ],
)  # fmt: skip
def test_the_check_finds_an_upward_arrow_and_a_cycle(graph, found):
    assert violations(graph) == found


@pytest.fixture(scope="module")
def unplanted(tmp_path_factory):
    """A copy of the package, to plant imports in, and what the check finds in it."""
    root = tmp_path_factory.mktemp("planted") / "explore_rl"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root, violations(package_imports(root))


@pytest.mark.parametrize(
    "module,line,found",
    [
        (
            "models/attention.py",
            "from explore_rl.sampling import shapes",
            ["models.attention (core/models) imports sampling.shapes (core/sampling)",
             "package cycle: models, sampling"],
        ),
        (
            "data/jsonl.py",  # the import answers.py replaced: data needs no reward
            "from explore_rl.rewards.math import after_hash",
            ["data.jsonl (core/data) imports rewards.math (core/rewards)",
             "package cycle: data, rewards"],
        ),
    ],
)  # fmt: skip
def test_a_planted_import_down_the_core_is_found(unplanted, module, line, found):
    """The package's own source with one import added: the check names that arrow and the
    cycle of packages it closes, and nothing else."""
    root, before = unplanted
    path = root / module
    source = path.read_text()
    try:
        path.write_text(source + f"\n{line}\n")
        assert [v for v in violations(package_imports(root)) if v not in before] == found
    finally:
        path.write_text(source)


def test_an_import_inside_a_function_counts(tmp_path):
    pkg = tmp_path / "explore_rl"
    (pkg / "rl").mkdir(parents=True)
    (pkg / "train").mkdir()
    for f in ("__init__.py", "rl/__init__.py", "train/__init__.py", "train/loop.py"):
        (pkg / f).write_text("")
    (pkg / "rl" / "plan.py").write_text("def f():\n    from explore_rl.train import loop\n")
    assert package_imports(pkg)["rl.plan"] == {"train.loop"}
    assert violations(package_imports(pkg)) == ["rl.plan (core/rl) imports train.loop (loop)"]


# Where a ConfigDict may be named: the entry point's translation into the run spec
# (`config`), a method's defaults made into its config section (`exploration.base`), and
# the modes and tools, which take a config from the command line or a notebook.
CONFIG_READERS = {"config", "exploration.base"}


def imported_modules(path: pathlib.Path) -> set[str]:
    """The absolute names a file's imports name (`import a.b`, `from a.b import c`: a.b)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module)
    return out


def configdict_importers(root: pathlib.Path) -> set[str]:
    """The package's modules that import ml_collections."""
    out = set()
    for p in root.rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if any(
            n == "ml_collections" or n.startswith("ml_collections.") for n in imported_modules(p)
        ):
            out.add(name)
    return out


def test_below_the_entry_point_nothing_reads_a_configdict():
    """The loop, evaluation, the methods and the core get the frozen, typed run spec
    (`spec.RunSpec`, resolved once by `config.spec`), never the ConfigDict."""
    importers = configdict_importers(PACKAGE)
    assert {"config", "main"} <= importers  # the scan sees the entry point's own imports
    modes = min(i for i, (name, _) in enumerate(LAYERS) if name == "modes")
    assert {m for m in importers if layer_of(m) < modes} - CONFIG_READERS == set()


def test_no_test_module_imports_conftest_or_another_test_module():
    """What test modules share is `tests/helpers.py` (and conftest.py's fixtures, which
    pytest gives by name): a test module imported by another runs its module-level code,
    and its fixtures and marks, twice over."""
    tests = pathlib.Path(__file__).resolve().parent
    found = {
        (p.name, n) for p in tests.glob("*.py") for n in imported_modules(p)
        if n == "conftest" or n.startswith("test_")
    }  # fmt: skip
    assert found == set()

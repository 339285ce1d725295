"""Lines of code per layer (tests/test_layering.py's LAYERS) and the longest functions of
a tree of the package, for BENCHMARKS.md (issue 29's before and after).

    python results/layer_lines.py .                       # this checkout
    git worktree add /tmp/old 6f5f017 && python results/layer_lines.py /tmp/old
"""

import ast
import importlib.util
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("layering", HERE / "tests" / "test_layering.py")
layering = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layering)
# modules of the tree before the redesign, by the layer their code moved to
MOVED = {"rl.trainer": "loop", "rl.sizing": "loop", "export": "modes", "evaluation.report": "tools"}


def main(root: str) -> None:
    package = pathlib.Path(root) / "explore_rl"
    lines, functions = {}, []
    for p in sorted(package.rglob("*.py")):
        name = ".".join(p.relative_to(package).with_suffix("").parts).removesuffix(".__init__")
        text = p.read_text()
        if not text.strip():
            continue
        layer = MOVED.get(name) or layering.LAYERS[layering.layer_of(name)][0]
        lines[layer] = lines.get(layer, 0) + len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
    order = [layer for layer, _ in layering.LAYERS]
    print("| layer | lines |\n|---|---|")
    for layer in order:
        print(f"| {layer} | {lines.get(layer, 0)} |")
    print(f"| all | {sum(lines.values())} |\n")
    print("| longest functions | lines |\n|---|---|")
    for n, name in sorted(functions, reverse=True)[:8]:
        print(f"| {name} | {n} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.getcwd())

"""The package's shape: no import cycle between its modules, and the examples'
model import does not load the benchmark harness."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "shapebucket"


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The shapebucket modules ``path`` imports, also inside functions (a lazy import
    still ties the two modules together)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("shapebucket"):
                # "from . import x" names submodule x; the package itself is always
                # loaded before its submodules, so that edge is no cycle
                subs = {
                    f"{target}.{a.name}"
                    for a in node.names
                    if (PKG.parent / (f"{target}.{a.name}".replace(".", "/") + ".py")).exists()
                }
                out |= subs if len(subs) == len(node.names) else {target, *subs}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("shapebucket")}
    return out - {name}


def test_no_import_cycle():
    graph = {module_name(p): imports_of(p) for p in PKG.rglob("*.py")}
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack, node, nxt]))
            if nxt in graph and not state.get(nxt):
                visit(nxt, [*stack, node])
        state[node] = 2

    for node in graph:
        if not state.get(node):
            visit(node, [])


def test_the_examples_model_import_does_not_load_the_harness():
    code = (
        "import sys, shapebucket.bench.model, shapebucket.bench.workloads; "
        "print(sorted(m for m in sys.modules if m.startswith('shapebucket.bench')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        out.stdout.strip()
        == "['shapebucket.bench', 'shapebucket.bench.model', 'shapebucket.bench.workloads']"
    )

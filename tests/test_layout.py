"""The package's shape: no import cycle, sizes, what an import loads and installs, and
the facts docs/architecture.md states."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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


# -- sizes: a part that grows splits by concern ------------------------------------------

MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 80


def _code_lines(node: ast.AST) -> int:
    """Lines of a function without its docstring (prose is not complexity)."""
    body = node.body  # type: ignore[attr-defined]
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and len(body) > 1
    ):
        first = body[1]
    return node.end_lineno - first.lineno + 1  # type: ignore[attr-defined]


def test_no_module_or_function_too_long():
    too_long = []
    for path in sorted(PKG.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(PKG.parent)}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(node)
                if n > MAX_FUNCTION_LINES:
                    too_long.append(
                        f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name}: {n}"
                    )
    assert too_long == []


# -- import has no side effects ----------------------------------------------------------

_PROBE = """
import json, logging, sys
import numpy, torch, torch._dynamo, torch.optim.optimizer
def handlers():
    return {
        name: [type(h).__name__ for h in logging.getLogger(name).handlers]
        for name in sorted(logging.root.manager.loggerDict)
        if name.startswith("torch")
    }
before_mods, before_handlers = set(sys.modules), handlers()
limit_before = torch._dynamo.config.recompile_limit
hooks_before = dict(sys.modules["torch.optim.optimizer"]._global_optimizer_pre_hooks)
import %s
print(json.dumps({
    "modules": sorted(m for m in set(sys.modules) - before_mods if m.startswith("shapebucket")),
    "handlers_changed": handlers() != before_handlers,
    "optimizer_hooks_changed": dict(sys.modules["torch.optim.optimizer"]._global_optimizer_pre_hooks) != hooks_before,
    "limit_changed": torch._dynamo.config.recompile_limit != limit_before,
    "heavy": sorted(
        m for m in ("triton", "transformers", "matplotlib", "tqdm")
        if m in sys.modules and m not in before_mods
    ),
}))
"""


#: ``import shapebucket`` loads the four concerns and the private core, nothing else:
#: not the benchmark, the CLI, the lengths helpers or the Hugging Face integration
CONCERNS = ("plan", "sampling", "collate", "compile", "bucketed")
CORE = ["shapebucket", "shapebucket._progress", "shapebucket._torch_compat"]
CORE += ["shapebucket._validate", "shapebucket.errors"]
#: loaded when first used: the triton kernels (the ``gpu`` extra)
LAZY = {"shapebucket.collate._triton_kernels"}
EXPECTED_MODULES = sorted(
    {*CORE, *(module_name(p) for c in CONCERNS for p in (PKG / c).glob("*.py"))} - LAZY
)
#: the examples' GPT needs the document mask, which loads the package (not the harness)
EXPECTED_BENCH_MODEL_MODULES = sorted(
    [*EXPECTED_MODULES, "shapebucket.bench", "shapebucket.bench.model"]
)


def _import_probe(module: str) -> dict:
    import json

    out = subprocess.run(
        [sys.executable, "-c", _PROBE % module], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_import_shapebucket_loads_exactly_the_core_and_installs_nothing():
    probe = _import_probe("shapebucket")
    assert probe["modules"] == EXPECTED_MODULES
    assert not any(m.startswith("shapebucket.bench") for m in probe["modules"])
    assert probe["handlers_changed"] is False
    assert probe["optimizer_hooks_changed"] is False
    assert probe["limit_changed"] is False
    assert probe["heavy"] == []  # optional dependencies load when used


@pytest.mark.slow  # a fresh interpreter importing torch: 4 s
def test_the_bench_model_loads_only_what_it_uses():
    probe = _import_probe("shapebucket.bench.model")
    assert probe["modules"] == EXPECTED_BENCH_MODEL_MODULES
    assert probe["handlers_changed"] is False


# -- what docs/architecture.md states ----------------------------------------------------

CORE_MODULES = {
    "shapebucket.errors",
    "shapebucket._validate",
    "shapebucket._torch_compat",
    "shapebucket._progress",
}
ALLOWED = {  # concern -> what it may import besides itself and the core
    "plan": set(),
    "sampling": {"plan"},
    "collate": {"plan"},
    "compile": {"plan", "collate"},
    "bucketed": {"plan", "collate", "compile"},
}


def test_architecture_page_lists_every_module():
    page = (PKG.parent / "docs" / "architecture.md").read_text()
    missing = [
        str(p.relative_to(PKG))
        for p in PKG.rglob("*.py")
        if p.name != "__init__.py"
        and p.parent.name != "bench"
        and f"`{p.relative_to(PKG).as_posix()}`" not in page
    ]
    missing += [
        p.name
        for p in (PKG / "bench").glob("*.py")
        if p.name != "__init__.py" and p.stem not in page
    ]
    assert missing == []


def test_imports_run_one_way():
    wrong = []
    for concern, allowed in ALLOWED.items():
        for path in (PKG / concern).rglob("*.py"):
            for target in imports_of(path):
                parts = target.split(".")
                if target not in CORE_MODULES and parts[1:2] not in (
                    [concern],
                    *[[a] for a in allowed],
                ):
                    wrong.append(f"{module_name(path)} imports {target}")
    assert wrong == []


def test_private_torch_apis_live_in_one_module():
    """``torch._anything`` (attribute or import) only in ``_torch_compat.py``."""
    found = []
    for path in PKG.rglob("*.py"):
        if path.name == "_torch_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute):
                names = [ast.unparse(node)]
            if any(n.startswith("torch.") and "._" in n and "__" not in n for n in names):
                found.append(f"{path.relative_to(PKG.parent)}:{node.lineno}")
    assert found == []

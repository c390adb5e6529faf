"""The package's shape: no import cycle, sizes, what an import loads and installs, and
the facts docs/architecture.md states."""

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "shapebucket"


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(stem: Path) -> bool:
    """Whether ``stem`` (a path without suffix) is a module or a package."""
    return stem.with_suffix(".py").exists() or (stem / "__init__.py").exists()


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
                    if _is_module(PKG.parent / f"{target}.{a.name}".replace(".", "/"))
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
CONCERNS = ("fit", "plan", "sampling", "collate", "compile", "bucketed")
CORE = ["shapebucket", "shapebucket._progress"]
CORE += [module_name(p) for p in (PKG / "_torch").glob("*.py")]
CORE += ["shapebucket._lengths", "shapebucket._memory", "shapebucket._validate"]
CORE += ["shapebucket.errors", "shapebucket._hf"]  # the seam imports no transformers
#: loaded when first used: the triton kernels (the ``gpu`` extra)
LAZY = {"shapebucket.collate._triton_kernels"}
EXPECTED_MODULES = sorted(
    {*CORE, *(module_name(p) for c in CONCERNS for p in (PKG / c).rglob("*.py"))} - LAZY
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
    "shapebucket._lengths",
    "shapebucket._memory",
    "shapebucket._validate",
    *(module_name(p) for p in (PKG / "_torch").glob("*.py")),
    "shapebucket._progress",
    "shapebucket._hf",
}
ALLOWED = {  # concern -> what it may import besides itself and the core
    "fit": set(),
    "plan": {"fit"},
    "sampling": {"fit", "plan"},
    "collate": {"fit", "plan"},
    "compile": {"fit", "plan", "collate"},
    "advise": {"fit"},
    "calibrate": {"fit", "plan", "compile"},
    "bucketed": {"fit", "plan", "collate", "compile"},
}


def test_architecture_page_lists_every_module():
    """Every module by its exact path (``bench/cli.py``, not a substring of it)."""
    page = (PKG.parent / "docs" / "architecture.md").read_text()
    missing = [
        p.relative_to(PKG).as_posix()
        for p in PKG.rglob("*.py")
        if p.name != "__init__.py" and f"`{p.relative_to(PKG).as_posix()}`" not in page
    ]
    assert missing == []


def test_architecture_page_lists_no_module_that_is_gone():
    import re

    page = (PKG.parent / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", page))
    repo_paths = ("shapebucket/", "tests/", "docs/", "benchmarks/", "scripts/")
    gone = sorted(n for n in named if not n.startswith(repo_paths) and not (PKG / n).exists())
    assert gone == []


def _page_import_table() -> dict[str, set[str]]:
    """The "Import direction" table of docs/architecture.md, as concern -> allowed."""
    page = (PKG.parent / "docs" / "architecture.md").read_text()
    section = page.split("## Import direction", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            allowed = {c.strip(" `") for c in cells[1].split(",")} - {"nothing"}
            table[cells[0].strip("`")] = allowed
    return table


def test_architecture_page_states_the_import_direction_the_test_checks():
    assert _page_import_table() == ALLOWED


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


def _in_torch_seam(path: Path) -> bool:
    """Whether ``path`` is a module of the torch seam, ``shapebucket/_torch/``."""
    return path.parent == PKG / "_torch"


def test_private_torch_apis_live_in_one_module():
    """``torch._anything`` (attribute or import) only in ``shapebucket/_torch/``."""
    found = []
    for path in PKG.rglob("*.py"):
        if _in_torch_seam(path):
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


def test_the_profilers_undocumented_events_are_read_in_one_module():
    """``kineto_results`` (no underscore, but undocumented) only behind the profiler seam."""
    found = [
        f"{p.relative_to(PKG.parent)}"
        for p in PKG.rglob("*.py")
        if p.relative_to(PKG).as_posix() != "_torch/profiler.py" and "kineto_results" in p.read_text()
    ]
    assert found == []


# -- named seams: no module reaches into another's private names -------------------------

#: the receivers whose private attributes a module may read: its own objects
OWN = {"self", "cls"}


def _defined_private_names(tree: ast.AST) -> set[str]:
    """Underscore names a module defines: functions, classes, attributes it assigns
    (``self._x = ...``, ``_x = ...``, class-level ``_x: int``) and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ = ("_a", ...), getattr(x, "_a")
    return {n for n in names if n.startswith("_")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reach_ins(path: Path) -> list[str]:
    """Where ``path`` uses another module's underscore name: ``from .x import _name``,
    or ``obj._name`` on an object other than ``self``/``cls`` when the module does not
    define ``_name`` itself. Underscore *modules* of the package (``_validate``,
    ``_torch``) are package-private seams and may be imported."""
    tree = ast.parse(path.read_text())
    own = _defined_private_names(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
            elif (node.module or "").startswith("shapebucket"):
                base = PKG.parent
            else:
                continue
            target = base.joinpath(*(node.module or "").split(".")) if node.module else base
            for alias in node.names:
                private_module = (target / f"{alias.name}.py").exists() or (
                    target / alias.name / "__init__.py"
                ).exists()
                if _is_private(alias.name) and not private_module:
                    out.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in OWN:
                continue
            if isinstance(receiver, ast.Call) and ast.unparse(receiver.func) == "super":
                continue
            if isinstance(receiver, ast.Name) and receiver.id in {"compat", "_torch"}:
                continue  # the compat module's private helpers are its own business
            if node.attr in own:
                continue
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_module_reaches_into_another_modules_private_names():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if _in_torch_seam(path):
            continue
        found += [f"{path.relative_to(PKG.parent)}:{x}" for x in private_reach_ins(path)]
    assert found == []


def test_private_torch_attributes_live_in_one_module():
    """``_orig_mod`` and every other private attribute of a torch object (a compiled
    module, a tensor, an optimizer) are read only in ``shapebucket/_torch/``; the check
    above covers them, this one names the most common offender on its own."""
    found = [
        f"{p.relative_to(PKG.parent)}"
        for p in PKG.rglob("*.py")
        if not _in_torch_seam(p) and "_orig_mod" in p.read_text()
    ]
    assert found == []


#: the private names of transformers and TRL that shapebucket/_hf.py holds
HF_PRIVATE = (
    "_remove_unused_columns",
    "_get_collator_with_removed_columns",
    "_save_checkpoint",
    "_get_output_dir",
    "_total_train_tokens",
    "_tp_size",
    "_metrics",
    "_attn_implementation",
)


def test_private_names_of_transformers_and_trl_live_in_one_module():
    """Every private name of transformers or TRL is used in ``_hf.py`` alone (as
    an attribute, a string or a method override), so a release that renames one breaks
    one module; the seam's own list of them is this list."""
    found = [
        f"{p.relative_to(PKG.parent)}: {name}"
        for p in sorted(PKG.rglob("*.py"))
        if p != PKG / "_hf.py"
        for name in HF_PRIVATE
        if re.search(rf"\b{name}\b", p.read_text())
    ]
    assert found == []
    text = (PKG / "_hf.py").read_text()
    assert all(f'"{name}"' in text for name in HF_PRIVATE)


# -- signatures: few parameters; options that belong together are one record --------------

MAX_PUBLIC_PARAMETERS = 8
MAX_CONSTRUCTOR_PARAMETERS = 10


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n not in ("self", "cls")]


#: records the package returns (reports, results, a finished batch), never built by users
RECORD_SUFFIXES = ("Report", "Result", "Estimate", "FlatBatch", "Setup", "Family")


@functools.cache  # parsed once per session: wide_signatures asks for it at every class
def _all_dataclasses() -> dict[str, ast.ClassDef]:
    out = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                "dataclass" in ast.unparse(d) for d in node.decorator_list
            ):
                out[node.name] = node
    return out


def _dataclass_fields(cls: ast.ClassDef) -> list[str] | None:
    """The ``__init__`` fields of a dataclass, its package base classes' included."""
    classes = _all_dataclasses()
    if cls.name not in classes:
        return None
    fields: list[str] = []
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            fields += _dataclass_fields(classes[base.id]) or []
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            text = ast.unparse(stmt)
            if "ClassVar" in text or "init=False" in text:
                continue
            if stmt.target.id not in fields:
                fields.append(stmt.target.id)
    return fields


def wide_signatures(path: Path) -> list[str]:
    """Public functions over 8 parameters, public constructors over 10."""
    out = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and not node.name.startswith(("_", *RECORD_SUFFIXES)):
            if node.name.endswith(RECORD_SUFFIXES):
                continue
            fields = _dataclass_fields(node)
            if fields is not None and len(fields) > MAX_CONSTRUCTOR_PARAMETERS:
                out.append(f"{node.lineno} {node.name}: {len(fields)} fields")
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    n = len(_parameters(fn))
                    if n > MAX_CONSTRUCTOR_PARAMETERS:
                        out.append(f"{fn.lineno} {node.name}.__init__: {n}")
                elif isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_"):
                    n = len(_parameters(fn))
                    if n > MAX_PUBLIC_PARAMETERS:
                        out.append(f"{fn.lineno} {node.name}.{fn.name}: {n}")
    for fn in tree.body:
        jit = isinstance(fn, ast.FunctionDef) and any(
            "jit" in ast.unparse(d) for d in fn.decorator_list
        )
        if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_") and not jit:
            n = len(_parameters(fn))
            if n > MAX_PUBLIC_PARAMETERS:
                out.append(f"{fn.lineno} {fn.name}: {n}")
    return out


def test_no_public_signature_too_wide():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        found += [f"{path.relative_to(PKG.parent)}:{x}" for x in wide_signatures(path)]
    assert found == []


def test_no_function_over_80_lines_with_its_docstring():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = node.end_lineno - start + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name}: {n}")
    assert found == []

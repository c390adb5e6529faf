"""``shapebucket.fit`` is pure: the rule, checked on the source.

The fitting layer takes lengths and numbers and returns records. It

1. imports no torch module and not ``_torch`` (so it holds no torch state and
   reads no compiler config: the recompile limit, dynamo's settings), nor any other
   layer of the package (``test_layout.py::test_imports_run_one_way``);
2. runs no user code: no function of ``fit/`` calls a parameter that may hold a user's
   function (typed ``Callable``/``Cost``/``Any``, or untyped), except ``cost``, the
   objective's price of a length (``fit_buckets(cost=...)``), which is a number-valued
   function of an int and part of the question asked, not a training step or a model.
   Reading the compiler's limit belongs to ``shapebucket.advise`` and
   ``shapebucket.compile``.

The check is static (the AST), so it holds for every path, also the ones no test runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

FIT = Path(__file__).resolve().parents[1] / "shapebucket" / "fit"

#: parameters that fit/ may call: the objective's cost of a length
CALLABLE_PARAMETERS = {"cost"}


def _torch_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
        else:
            continue
        for name in names:
            if (
                name == "torch"
                or name.startswith("torch.")
                or name.endswith("_torch")
                or "._torch." in name
            ):
                found.append((node.lineno, name))
    return found


def _may_be_user_code(arg: ast.arg) -> bool:
    """A parameter that may hold a user's function: typed as a callable (``Callable``,
    ``Cost``), as ``Any``, or not typed at all; one typed as a package record (a
    ``Buckets``, the packing search's evaluator) is the package's own object."""
    if arg.arg in ("self", "cls", *CALLABLE_PARAMETERS):
        return False
    if arg.annotation is None:
        return True
    text = ast.unparse(arg.annotation)
    return any(word in text for word in ("Callable", "Cost", "Any"))


def _calls_of_parameters(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls of a parameter that may hold user code (``_may_be_user_code``)."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        a = fn.args
        args = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]
        params = {x.arg for x in args if _may_be_user_code(x)}
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in params
            ):
                found.append((node.lineno, node.func.id))
    return found


def _violations() -> list[str]:
    out = []
    for path in sorted(FIT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(FIT.parents[1]).as_posix()
        out += [f"{rel}:{line} imports {name}" for line, name in _torch_imports(tree)]
        out += [
            f"{rel}:{line} calls its parameter {name}" for line, name in _calls_of_parameters(tree)
        ]
    return out


def test_fit_imports_no_torch_and_runs_no_user_code():
    assert _violations() == []


def test_the_rule_finds_what_it_forbids():
    """The checks above can fail: each catches the code it forbids."""
    bad = ast.parse(
        "import torch._dynamo\n"
        "from .._torch import get_recompile_limit\n"
        "def f(lengths, step, cost, hook: Callable[[int], int], table: Buckets):\n"
        "    step(lengths)\n"
        "    hook(2)\n"
        "    table(1)\n"
        "    return cost(3)\n"
    )
    assert _torch_imports(bad) == [(1, "torch._dynamo"), (2, "_torch")]
    assert _calls_of_parameters(bad) == [(4, "step"), (5, "hook")]

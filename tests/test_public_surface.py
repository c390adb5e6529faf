"""The public surface a user learns: the top level, then at most 60 more names across
the subpackages (the benchmark aside), each with a docstring, each importable. What a
user never builds (the records functions return, internal helpers) is reached by its
module path instead; docs/api.md still documents the records (``RECORDS``)."""

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

import shapebucket

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "shapebucket"

#: the most names the subpackages may export beyond ``shapebucket.__all__``
MAX_SUBPACKAGE_EXPORTS = 60


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _declared_all(path: Path) -> list[str] | None:
    """The names of ``__all__`` as the file declares them, read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return None


def public_subpackages() -> list[Path]:
    """Every subpackage's ``__init__.py`` but the top level's, the benchmark's and the private ones'."""
    out = []
    for init in sorted(PKG.rglob("__init__.py")):
        parts = init.parent.relative_to(PKG).parts
        if parts and parts[0] != "bench" and not any(p.startswith("_") for p in parts):
            out.append(init)
    return out


def subpackage_exports() -> dict[str, list[str]]:
    """Per subpackage, the names of its ``__all__`` that the top level does not export."""
    top = set(shapebucket.__all__)
    return {
        _module_name(init): [n for n in (_declared_all(init) or []) if n not in top]
        for init in public_subpackages()
    }


def test_the_subpackages_export_at_most_sixty_names():
    exports = subpackage_exports()
    total = sum(len(names) for names in exports.values())
    counts = {m: len(names) for m, names in exports.items() if names}
    assert total <= MAX_SUBPACKAGE_EXPORTS, f"{total} names exported: {counts}"


def test_the_count_sees_every_subpackage_and_no_benchmark():
    exports = subpackage_exports()
    assert {
        "shapebucket.fit",
        "shapebucket.compile",
        "shapebucket.compile.modes",
        "shapebucket.hf",
    } <= set(exports)
    assert not any(m.startswith(("shapebucket.bench", "shapebucket._")) for m in exports)
    assert "prewarm" not in exports["shapebucket.compile"]  # a top-level name counts once


def _own_doc(obj: object) -> str:
    """``obj``'s own docstring: not a base class's, not the signature a dataclass writes."""
    doc = obj.__doc__ if inspect.isclass(obj) or inspect.isroutine(obj) else None
    name = getattr(obj, "__name__", "")
    if not doc or doc.startswith(f"{name}(") or (inspect.isclass(obj) and doc is object.__doc__):
        return ""
    return doc.strip()


def _import(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:  # an optional extra (transformers, trl, triton)
        if e.name and not e.name.startswith("shapebucket"):
            pytest.skip(f"{module_name} needs {e.name}")
        raise


@pytest.mark.parametrize("module_name", ["shapebucket", *sorted(subpackage_exports())])
def test_every_exported_name_has_a_docstring(module_name):
    module = _import(module_name)
    missing = [n for n in getattr(module, "__all__", []) if not _own_doc(getattr(module, n))]
    assert missing == [], f"{module_name}: no docstring for {missing}"


ALL_MODULES = sorted(_module_name(p) for p in PKG.rglob("*.py") if _declared_all(p) is not None)


@pytest.mark.parametrize("module_name", ALL_MODULES)
def test_every_name_of_every_all_is_importable(module_name):
    module = _import(module_name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{module_name}.__all__ names {missing}, which it does not define"


def _api_docs_script():
    spec = importlib.util.spec_from_file_location(
        "build_api_docs", ROOT / "scripts" / "build_api_docs.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_records_are_reached_by_their_module_and_not_exported():
    script = _api_docs_script()
    exported = set(shapebucket.__all__).union(*subpackage_exports().values())
    paths = [p for paths in script.RECORDS.values() for p in paths]
    assert "shapebucket.fit.packing.PackingReport" in paths
    for path in paths:
        obj = script.record(path)
        assert _own_doc(obj), path
        assert path.rsplit(".", 1)[-1] not in exported, (
            f"{path} is returned, not built: keep it out of __all__"
        )

"""Write docs/api.md from the docstrings of every public name: ``shapebucket.__all__``,
then each subpackage's ``__all__`` (the names it adds to the top level), then the
records its functions return (:data:`RECORDS`: a user reads them but never builds one,
so they are reached by their module path and not exported).

    python scripts/build_api_docs.py          # rewrite docs/api.md
    python scripts/build_api_docs.py --check  # exit 1 if docs/api.md is stale

The test suite runs the check, so the page never drifts from the code.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package
import shapebucket

OUT = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _signature(obj: object, name: str) -> str:
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return name
    return f"{name}{sig}"


#: the subpackages documented after the top level, in the order a reader meets them
MODULES = [
    "shapebucket.fit",
    "shapebucket.plan",
    "shapebucket.advise",
    "shapebucket.sampling",
    "shapebucket.collate",
    "shapebucket.compile",
    "shapebucket.bucketed",
    "shapebucket.calibrate",
    "shapebucket.hf",
    "shapebucket.hf.trl",
]

#: per subpackage, the records (and the handle) its functions return, by module path
RECORDS = {
    "shapebucket.fit": [
        "shapebucket.fit.padding.PaddingReport",
        "shapebucket.fit.packing.PackingReport",
        "shapebucket.fit.packing_fit.PackingFitReport",
        "shapebucket.fit.cell_fit.CellsReport",
    ],
    "shapebucket.advise": [
        "shapebucket.advise.kchoice.KChoiceReport",
        "shapebucket.advise.kchoice.KEstimate",
        "shapebucket.advise.policies.PolicyReport",
    ],
    "shapebucket.sampling": ["shapebucket.fit.batches.SamplerReport"],
    "shapebucket.collate": [
        "shapebucket.collate.device.FlatBatch",
        "shapebucket.collate.counters.CollateReport",
    ],
    "shapebucket.compile": [
        "shapebucket.compile.report.PrewarmReport",
    ],
    "shapebucket.bucketed": [
        "shapebucket.bucketed.stats.BucketedReport",
        "shapebucket.bucketed.fitting.CallShapes",
    ],
    "shapebucket.calibrate": [
        "shapebucket.calibrate.report.RowsReport",
        "shapebucket.calibrate.report.Probe",
    ],
}


def record(path: str) -> object:
    """The object at a dotted ``module.Name`` path."""
    module_name, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), name)


def _documented() -> set[object]:
    """Every class and function this page gives an entry of its own."""
    objs = {getattr(shapebucket, n) for n in shapebucket.__all__}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        objs |= {getattr(module, n) for n in module.__all__}
    return objs | {record(p) for paths in RECORDS.values() for p in paths}


def _members(cls: type) -> tuple[dict[str, object], dict[str, list[str]]]:
    """``cls``'s public members to document here (its own, and those of a package base
    class that has no entry of its own, such as the collators' shared base), and, per
    documented base class, the public members ``cls`` inherits from it."""
    documented, own, inherited = _documented(), {}, {}
    for klass in cls.__mro__:
        if klass is not cls and not klass.__module__.startswith("shapebucket."):
            continue
        names = [a for a in vars(klass) if not a.startswith("_") and a not in own]
        if klass is cls or klass not in documented:
            own.update({a: vars(klass)[a] for a in names})
        else:
            inherited[klass.__name__] = sorted(a for a in names if _doc(vars(klass)[a]))
            own.update({a: None for a in names})  # documented at the base
    return {a: m for a, m in own.items() if m is not None}, inherited


def _doc(member: object) -> str | None:
    if not (inspect.isfunction(member) or isinstance(member, (property, classmethod))):
        return None
    target = member.__func__ if isinstance(member, classmethod) else member
    target = target.fget if isinstance(target, property) else target
    return inspect.getdoc(target)


def _entry(name: str, obj: object, level: str) -> list[str]:
    """The heading, signature and docstring of ``obj``, then its documented methods."""
    kind = "class" if inspect.isclass(obj) else "function"
    short = name.rsplit(".", 1)[-1]
    parts = [f"{level} `{name}`", "", f"```python\n{kind} {_signature(obj, short)}\n```", ""]
    parts += [_as_markdown(inspect.getdoc(obj) or ""), ""]
    if inspect.isclass(obj):
        own, inherited = _members(obj)
        for attr, member in sorted(own.items()):
            mdoc = _doc(member)
            if not mdoc:
                continue
            target = member.__func__ if isinstance(member, classmethod) else member
            sig = attr if isinstance(member, property) else _signature(target, attr)
            parts += [f"{level}# `{short}.{sig}`", "", _as_markdown(mdoc), ""]
        for base, names in inherited.items():
            if names:
                parts += [f"From `{base}`: " + ", ".join(f"`{n}`" for n in names) + ".", ""]
    return parts


def render() -> str:
    parts = [
        "# API reference",
        "",
        "Generated from the docstrings by `python scripts/build_api_docs.py`; do not edit by hand.",
        "First the names importable from `shapebucket`, then what each subpackage adds",
        "(`shapebucket.hf` and `shapebucket.hf.trl` import transformers and trl: the `hf`",
        "and `trl` extras).",
        "",
    ]
    for name in shapebucket.__all__:
        parts += _entry(name, getattr(shapebucket, name), "##")
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        extra = [n for n in module.__all__ if n not in shapebucket.__all__]
        same = [n for n in module.__all__ if n in shapebucket.__all__]
        parts += [f"# `{module_name}`", "", (inspect.getdoc(module) or "").split("\n\n")[0], ""]
        if same:
            parts += ["Also here: " + ", ".join(f"`{n}`" for n in same) + " (above).", ""]
        for name in extra:
            parts += _entry(f"{module_name}.{name}", getattr(module, name), "##")
        if RECORDS.get(module_name):
            parts += ["Returned, not exported (reached by the module path):", ""]
        for path in RECORDS.get(module_name, []):
            parts += _entry(path, record(path), "##")
    return "\n".join(parts).rstrip() + "\n"


def _as_markdown(doc: str) -> str:
    """Docstring text with ``>>>`` example blocks fenced as Python."""
    out, in_example = [], False
    for line in doc.splitlines():
        starts = line.lstrip().startswith(">>>")
        if starts and not in_example:
            out.append("```python")
            in_example = True
        elif in_example and not line.strip():
            out.append("```")
            in_example = False
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python scripts/build_api_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

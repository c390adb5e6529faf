"""Write docs/api.md from the docstrings of every name in ``shapebucket.__all__``.

    python scripts/build_api_docs.py          # rewrite docs/api.md
    python scripts/build_api_docs.py --check  # exit 1 if docs/api.md is stale

The test suite runs the check, so the page never drifts from the code.
"""

from __future__ import annotations

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


def render() -> str:
    parts = [
        "# API reference",
        "",
        "Generated from the docstrings by `python scripts/build_api_docs.py`; do not edit by hand.",
        "Every name below is importable from `shapebucket`.",
        "",
    ]
    for name in shapebucket.__all__:
        obj = getattr(shapebucket, name)
        kind = "class" if inspect.isclass(obj) else "function"
        parts += [f"## `{name}`", "", f"```python\n{kind} {_signature(obj, name)}\n```", ""]
        doc = inspect.getdoc(obj) or ""
        parts += [_as_markdown(doc), ""]
        if inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                if attr.startswith("_") or not (
                    inspect.isfunction(member) or isinstance(member, (property, classmethod))
                ):
                    continue
                target = member.__func__ if isinstance(member, classmethod) else member
                target = target.fget if isinstance(target, property) else target
                mdoc = inspect.getdoc(target)
                if not mdoc:
                    continue
                sig = attr if isinstance(member, property) else _signature(target, attr)
                parts += [f"### `{name}.{sig}`", "", _as_markdown(mdoc), ""]
    parts += [
        "## `shapebucket.hf.BucketTrainer`",
        "",
        "The Hugging Face `Trainer` integration lives in `shapebucket.hf` (it imports",
        "transformers, so the top-level package does not); see `docs/integrations.md`.",
        "",
    ]
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

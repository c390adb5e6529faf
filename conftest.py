"""Collection rules for the doctests under shapebucket/ (pytest's testpaths include it)."""

import importlib.util


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        return False


# the doctests of shapebucket.hf need the hf extra, and shapebucket/hf/trl.py needs trl too
collect_ignore: list[str] = []
if not _has("transformers"):
    collect_ignore.append("shapebucket/hf")
elif not _has("trl"):
    collect_ignore.append("shapebucket/hf/trl.py")

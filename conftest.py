"""Collection rules for the doctests under shapebucket/ (pytest's testpaths include it)."""

import importlib.util


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        return False


# the deprecated shapebucket.compile shim warns on import; its names are tested where they live
collect_ignore = ["shapebucket/compile.py"]
if not _has("transformers"):  # shapebucket.hf needs the hf extra
    collect_ignore.append("shapebucket/hf.py")

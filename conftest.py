"""Collection rules for the doctests under shapebucket/ (pytest's testpaths include it)."""

import importlib.util

# the deprecated shapebucket.compile shim warns on import; its names are tested where they live
collect_ignore = ["shapebucket/compile.py"]
if importlib.util.find_spec("transformers") is None:  # shapebucket.hf needs the hf extra
    collect_ignore.append("shapebucket/hf.py")

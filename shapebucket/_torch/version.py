"""The torch release shapebucket runs on (checked when the package loads), and the
features that need a newer one (``docs/compile.md``, "Torch versions").

>>> has("compile_recompile_limit") == (TORCH_VERSION >= (2, 13))
True
"""

from __future__ import annotations

import torch

# no __all__: private to the package


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string.

    >>> parse_version("2.11.0+cu130"), parse_version("2.15.0a0+git1234"), parse_version("3.0")
    ((2, 11), (2, 15), (3, 0))
    """
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


#: the oldest torch shapebucket runs on (the import refuses an older one)
MIN_TORCH = (2, 11)
#: the installed torch's ``(major, minor)``
TORCH_VERSION = parse_version(torch.__version__)

#: feature -> the torch release it needs: every feature newer than :data:`MIN_TORCH`
#: that shapebucket uses, asked with :func:`has` where it is used
FEATURES: dict[str, tuple[int, int]] = {
    "compile_recompile_limit": (2, 13),  # torch.compile(..., recompile_limit=N)
}


def check_floor(version: str = torch.__version__) -> None:
    """Raise ``ImportError`` when ``version`` is older than :data:`MIN_TORCH`.

    >>> check_floor("2.13.0")
    >>> check_floor("2.10.1")
    Traceback (most recent call last):
    ...
    ImportError: shapebucket needs torch >= 2.11, found 2.10.1
    """
    if parse_version(version) < MIN_TORCH:
        floor = ".".join(map(str, MIN_TORCH))
        raise ImportError(f"shapebucket needs torch >= {floor}, found {version}")


def has(feature: str) -> bool:
    """Whether the installed torch has ``feature`` (a key of :data:`FEATURES`)."""
    return FEATURES[feature] <= TORCH_VERSION


def recompile_limit_fix(n: int | str) -> str:
    """How to compile with a recompile limit of ``n`` on this torch: ``torch.compile``
    takes ``recompile_limit=`` from 2.13 on; older releases set dynamo's global config.

    >>> recompile_limit_fix(9) in (
    ...     "torch.compile(..., recompile_limit=9)", "torch._dynamo.config.recompile_limit = 9"
    ... )
    True
    """
    if has("compile_recompile_limit"):
        return f"torch.compile(..., recompile_limit={n})"
    return f"torch._dynamo.config.recompile_limit = {n}"


check_floor()

"""The torch release shapebucket runs on, checked when the package loads."""

from __future__ import annotations

import torch


def _parse_version(text: str) -> tuple[int, int]:
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


MIN_TORCH = (2, 13)


TORCH_VERSION = _parse_version(torch.__version__)


if TORCH_VERSION < MIN_TORCH:  # pragma: no cover - guarded by the package's torch requirement
    raise ImportError(
        f"shapebucket needs torch >= {'.'.join(map(str, MIN_TORCH))}, found {torch.__version__}"
    )

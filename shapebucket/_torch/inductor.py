"""Inductor's caches: where they live, their portable artifacts, a fresh one."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch


def inductor_cache_dir() -> str:
    """Directory inductor keeps compiled kernels and FX graphs in."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return str(cache_dir())


def save_cache_artifacts() -> bytes | None:
    """The compiler's portable cache artifacts of this process (``None``: nothing to save)."""
    result = torch.compiler.save_cache_artifacts()
    return None if result is None else result[0]


def load_cache_artifacts(data: bytes) -> bool:
    """Load the compiler's cache artifacts; False when it could not read them (torch logs
    a warning and returns None for corrupt bytes; that log is silenced here)."""
    logger = logging.getLogger("torch.compiler._cache")
    old = logger.disabled
    logger.disabled = True
    try:
        return torch.compiler.load_cache_artifacts(data) is not None
    finally:
        logger.disabled = old


@contextlib.contextmanager
def fresh_inductor_cache(directory: str) -> Iterator[None]:
    """Compile into an empty inductor cache for the block (and clear in-memory caches),
    so each benchmark strategy pays its own cold compile."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with temporary_cache_dir(directory):
        yield

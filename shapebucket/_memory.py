"""This machine's memory: its size, and the refusal of a batch that cannot fit in it."""

from __future__ import annotations

import os
from typing import Any

from .errors import ShapeBucketError

__all__ = ["check_fits_in_memory", "physical_memory"]


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or ``None`` where the platform does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not on this platform
        return None


def check_fits_in_memory(rows: int, bucket: int, n_keys: int, buckets: Any) -> None:
    """Refuse a batch that cannot fit in this machine's memory before allocating it: with
    memory overcommit, a too-large allocation succeeds and the process is killed later."""
    need = rows * bucket * (8 * n_keys + 2) + 16 * bucket  # 8-byte values, masks, positions
    if need < 2**30:  # every machine that runs a model has a GiB: skip asking the OS
        return
    total = physical_memory()
    if total is not None and need > total:
        raise ShapeBucketError(
            f"a batch of {rows} rows at bucket {bucket} needs about {need / 2**30:.1f} GiB, more "
            f"than this machine's {total / 2**30:.1f} GiB of memory; check the bucket table "
            f"{buckets!r} and the batch size"
        )

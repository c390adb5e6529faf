"""One builder per compile cache: processes of one job (torchrun ranks, a rerun next to
a running job) that share a cache directory take turns on it.

:func:`cache_lock` holds an exclusive ``fcntl.flock`` on ``<cache>.lock`` (a file next
to the cache directory) from before the cache is read until after it is saved. The
first process to take it finds no cache, compiles and saves; the others wait on the
lock and then find the saved cache and load it. The kernel releases the lock when its
holder's file is closed, including when the process is killed, so a crashed builder
never blocks the others; what it left half-written is a temporary directory that
:func:`~shapebucket.compile.load_compile_cache` never reads (saves are an atomic
rename of a complete directory whose manifest is written last).

Without ``fcntl`` (Windows) there is no lock: each process loads what is there,
compiles what is missing and saves atomically, the last save winning; the cache is
never half-written, only built more than once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import ShapeBucketError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCKS", "cache_lock"]

#: whether this platform has the lock (``fcntl.flock``)
LOCKS = fcntl is not None


def _try_lock(f: IO[Any]) -> bool:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def cache_lock(path: str | Path, timeout: float | None = None) -> Iterator[float]:
    """Hold the cache at ``path`` for this process alone; yields the seconds it waited.

    ``timeout`` (seconds, ``None``: wait as long as the builder takes) raises
    :class:`ShapeBucketError` naming the lock file when another process holds it longer.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     with cache_lock(f"{tmp}/cache") as waited:
    ...         waited < 1.0
    True
    """
    if fcntl is None:
        yield 0.0
        return
    lock = Path(path).with_name(Path(path).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with lock.open("a") as f:
        while not _try_lock(f):
            if timeout is not None and time.perf_counter() - t0 > timeout:
                raise ShapeBucketError(
                    f"compile cache {str(path)!r}: another process has held {lock} for more "
                    f"than {timeout:g} s (building the cache); raise the timeout, or remove the "
                    "lock file if no process of this job is running"
                )
            time.sleep(0.05)
        try:
            yield time.perf_counter() - t0
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)

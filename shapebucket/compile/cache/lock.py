"""One builder per compile cache: processes sharing a cache directory take turns on it
through an ``fcntl.flock`` on ``<cache>.lock``; without ``fcntl`` (Windows) there is no
lock (``docs/compile.md``, "Several processes, one cache")."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ...errors import ShapeBucketError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCKS", "WAIT_S", "cache_lock"]

#: whether this platform has the lock (``fcntl.flock``)
LOCKS = fcntl is not None

#: how long a process waits, by default, for another one building the same cache (seconds):
#: 30 minutes, enough for another rank's cold compile of many shapes of a large model
WAIT_S = 1800.0


def _try_lock(f: IO[Any]) -> bool:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(lock: Path) -> str:
    """Who holds ``lock``, as its holder wrote it (``pid N on HOST``), if it did."""
    try:
        said = lock.read_text().strip()
    except OSError:
        said = ""
    return said[:120] or "another process"


def _open(lock: Path, path: str | Path) -> IO[Any]:
    if lock.is_dir():
        raise ShapeBucketError(
            f"compile cache {str(path)!r}: its lock {lock} is a directory, so no process can "
            f"lock the cache; remove it (rm -r {str(lock)!r}) and run again"
        )
    lock.parent.mkdir(parents=True, exist_ok=True)
    return lock.open("a")


def _wait(f: IO[Any], lock: Path, path: str | Path, timeout: float | None) -> float:
    """Take the lock, telling once who holds it; the seconds waited."""
    t0 = time.perf_counter()
    told = False
    while not _try_lock(f):
        waited = time.perf_counter() - t0
        if not told:
            told = True
            warnings.warn(
                f"compile cache {str(path)!r}: waiting for {lock}, held by {_holder(lock)} "
                "(building the cache; this process loads it when the lock is released), for "
                f"up to {'ever' if timeout is None else f'{timeout:g} s'}. The lock goes when "
                "its holder exits, even killed; if that process hangs, end that process",
                stacklevel=4,
            )
        if timeout is not None and waited > timeout:
            raise ShapeBucketError(
                f"compile cache {str(path)!r}: {_holder(lock)} has held {lock} for more than "
                f"{timeout:g} s (waited {waited:.1f} s; it is building the cache); raise the "
                "wait (Cache(dir, timeout=seconds), None: no limit), or end that process if it "
                "hangs (the lock goes with it; on a network filesystem whose holder's machine "
                "is gone, remove the lock file)"
            )
        time.sleep(0.05)
    return time.perf_counter() - t0


@contextlib.contextmanager
def cache_lock(path: str | Path, timeout: float | None = WAIT_S) -> Iterator[float]:
    """Hold the cache at ``path`` for this process alone; yields the seconds it waited.

    While another process holds it, a warning says once which lock and who holds it
    (the holder writes ``pid N on HOST`` into the lock file); after ``timeout``
    seconds (:data:`WAIT_S`, 30 minutes, by default; ``None``: wait as long as the
    builder takes) :class:`ShapeBucketError` names the lock file, the seconds waited
    and the fix. A lock path that is a directory is refused.

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
    with _open(lock, path) as f:
        waited = _wait(f, lock, path, timeout)
        try:
            f.truncate(0)  # who holds it, for the processes that wait
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            f.flush()
            yield waited
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)

"""The ``Cache`` mode: compiled code kept between runs under a key, one builder at a time."""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from ... import _torch as compat
from ..._validate import check_number
from ...errors import ShapeBucketError
from ..cache.key import job_key
from ..cache.load import check_compile_cache, load_compile_cache
from ..cache.lock import WAIT_S, cache_lock
from ..cache.save import save_held_compile_cache
from .base import Job, Mode

__all__ = ["Cache"]


_TIMEOUT_HINT = f"; pass seconds (the default is {WAIT_S:g}), or None to wait as long as it takes"


@dataclass(frozen=True)
class Cache(Mode):
    """Keep the compiled code between runs in ``dir/<key>``.

    Loads the cache before the first compile and saves it after compiling
    anything new. The key hashes what invalidates compiled code: torch version,
    devices, the source of the model's module classes and of ``step``, the names,
    shapes, dtypes and ``requires_grad`` of its parameters and buffers, every
    shape's batch (shapes, dtypes, strides), the other modes, and ``extra``
    (put the compile options there: ``"mode=max-autotune fullgraph=True"``).
    A damaged or foreign cache is refused with a warning
    (:func:`~shapebucket.compile.load_compile_cache`). Processes sharing ``dir``
    take turns on a key (:func:`~shapebucket.compile.cache.lock.cache_lock`): the first
    compiles and saves, the others wait (``report.cache_wait_s``; a warning says once
    who holds the lock) and load it. ``timeout`` bounds that wait (seconds; 30 minutes,
    enough for another rank's cold compile of many shapes; ``None``: no limit).
    A ``dir`` this process cannot write is used read-only when it holds an intact
    cache of the job (loaded, without the lock; nothing saved), else refused.
    """

    dir: str | Path = "compile-cache"
    extra: str = ""
    timeout: float | None = WAIT_S

    def __post_init__(self) -> None:
        if not isinstance(self.dir, (str, Path)):
            raise ShapeBucketError(f"Cache(dir) must be a path, got {self.dir!r}")
        if str(self.dir).strip() == "":
            name = type(self).__name__
            raise ShapeBucketError(
                f"{name}(dir={str(self.dir)!r}) would write the cache into the working "
                f"directory; name a directory for it, e.g. {name}('compile-cache')"
            )
        if not isinstance(self.extra, str):
            raise ShapeBucketError(f"Cache(extra) must be a str, got {self.extra!r}")
        if self.timeout is not None:
            check_number("Cache(timeout)", self.timeout, above=0, hint=_TIMEOUT_HINT)

    def key(self, job: Job) -> str:
        """The cache key of ``job`` (batches are made one at a time, only to describe them)."""
        others = sorted(repr(m) for m in job.modes if not isinstance(m, Cache))
        batches = ((f"{s.rows}x{s.length}", job.batch(s)) for s in job.plan)
        return job_key(job.model, job.step, batches, self.extra + "".join(others))

    def _check_dir(self, path: Path) -> bool:
        """Whether prewarm can write the cache directory, checked before compiling anything;
        one it cannot write is used read-only when it holds an intact cache at ``path``."""
        where = Path(self.dir)
        try:
            where.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ShapeBucketError(
                f"Cache(dir={str(self.dir)!r}): {where} is not a directory (a file is in the "
                "way); pass the path of a directory, or remove that file"
            ) from None
        except OSError as e:
            raise ShapeBucketError(
                f"Cache(dir={str(self.dir)!r}): cannot create the cache directory ({e}); pass a "
                "directory this process can write"
            ) from None
        if os.access(where, os.W_OK | os.X_OK):
            return True
        if os.access(where, os.R_OK | os.X_OK) and check_compile_cache(path) is None:
            return False  # a complete cache for this job: loaded, nothing to write
        raise ShapeBucketError(
            f"Cache(dir={str(self.dir)!r}): {where} is not writable and holds no complete "
            f"cache for this job ({path.name}), so the compiled code could not be saved; pass "
            "a directory this process can write"
        )

    def extra_files(self, job: Job) -> dict[str, bytes]:
        """Files to save with the cache beside what the compiler built (``AotCache``'s)."""
        return {}

    def setup(self, job: Job) -> None:
        path = Path(self.dir) / self.key(job)
        writable = self._check_dir(path)
        job.memo["cache_path"] = path
        job.memo["cache_counts"] = compat.inductor_cache_counts()
        job.memo["cache_writable"] = writable
        job.report.cache_path = str(path)
        # one builder per cache, the others wait here (the lock goes with the job, also on
        # error); a read-only directory (a shared, finished cache) has no builder and no lock
        lock = contextlib.ExitStack()
        job.memo["cache_lock"] = lock
        if writable:
            job.report.cache_wait_s = lock.enter_context(cache_lock(path, self.timeout))
        job.report.cache_loaded = load_compile_cache(path)

    def finish(self, job: Job) -> None:
        hits, misses = compat.inductor_cache_counts()
        hits_before, misses_before = job.memo["cache_counts"]
        # save what inductor compiled anew, and graphs this machine's inductor cache served
        # when this directory held nothing (else the next machine would start cold)
        try:
            extra = self.extra_files(job)
            new = misses > misses_before or (hits > hits_before and not job.report.cache_loaded)
            if not job.memo["cache_writable"]:
                if new or extra:
                    warnings.warn(
                        f"Cache(dir={str(self.dir)!r}) is read-only: what prewarm compiled "
                        f"beyond its cache {job.memo['cache_path'].name} was not saved; the "
                        "next run compiles it again (save it from a run that can write there)",
                        stacklevel=2,
                    )
            elif new or extra:
                save_held_compile_cache(job.memo["cache_path"], extra)
                job.report.cache_saved = True
        finally:
            job.memo["cache_lock"].close()

"""Saving what the compiler built: atomically, beside the previous cache, under the lock;
only a cache is ever replaced (``docs/compile.md``, "The compile cache")."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ... import _torch as compat
from ...errors import ShapeBucketError
from .load import (
    ARTIFACTS,
    INDUCTOR,
    MANIFEST,
    check_compile_cache,
    read_manifest,
    sha256,
)
from .lock import LOCKS, cache_lock

#: a save's leftover (``.<name>.saving-*``, ``.<name>.old-*``) untouched this long (seconds)
#: is removed by a save that cannot hold the lock: no save takes an hour between writes
STALE_S = 3600.0

#: inductor's own directories a save leaves out: precompiled C++ headers are built for one
#: compiler and its flags, rebuilt in seconds when missing, and no cached kernel reads
#: them; one machine's came to 3.6 GB (51 files), which a save copied into every cache
UNSAVED_DIRS = frozenset({"precompiled_headers"})

__all__ = ["save_compile_cache", "save_held_compile_cache"]


def _copy_file(src: str, dst: str) -> None:
    """Every file a save writes goes through here or :func:`_write_bytes` (the
    fault-injection test interrupts them)."""
    shutil.copy2(src, dst)


def _write_bytes(dst: Path, data: bytes) -> None:
    dst.write_bytes(data)


def save_compile_cache(
    path: str | Path, extra: Mapping[str, bytes] | None = None
) -> dict[str, int]:
    """Persist what the compiler built in this process to directory ``path``, atomically.

    Writes the compiler's cache artifacts (``torch.compiler.save_cache_artifacts``)
    and a copy of inductor's cache directory (compiled kernels and FX graphs; on
    CPU this is what saves the most time), merged with the intact cache already
    at ``path``, into a temporary directory; the manifest is written last and the
    directory then replaces ``path``. ``extra`` adds files (a name beside the
    artifacts: its bytes), checked by the manifest like the rest; those of the cache
    already at ``path`` are kept unless ``extra`` names them. Returns byte counts.

    Only a cache is replaced: a file at ``path``, or a directory holding anything a cache
    does not, is refused with :class:`ShapeBucketError` (nothing is moved or deleted).
    The save holds the cache's lock, waiting for another process's save or prewarm on
    ``path`` (:func:`~shapebucket.compile.cache.lock.cache_lock`, at most ``WAIT_S`` seconds).

    >>> sizes = save_compile_cache("compile-cache")  # doctest: +SKIP
    >>> sorted(sizes)  # doctest: +SKIP
    ['artifacts_bytes', 'inductor_bytes']

    (Not run as a doctest: it copies this machine's whole inductor cache;
    ``tests/test_compile_cache.py`` runs it.)
    """
    extra = _check_extra(extra)
    _check_replaceable(Path(path))  # before waiting on the lock; again under it
    with cache_lock(path):
        return _save(Path(path), extra)


def save_held_compile_cache(
    path: str | Path, extra: Mapping[str, bytes] | None = None
) -> dict[str, int]:
    """:func:`save_compile_cache` for a caller that already holds ``path``'s
    :func:`~shapebucket.compile.cache.lock.cache_lock` (prewarm's ``Cache``): a second lock on
    the same file in one process would wait for itself."""
    return _save(Path(path), _check_extra(extra))


def _save(path: Path, extra: dict[str, bytes]) -> dict[str, int]:
    """Build the cache beside ``path``, then rename it into place."""
    _check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(path, locked=LOCKS)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.saving-", dir=path.parent))
    try:
        intact = check_compile_cache(path) is None
        sizes = _build(tmp, path if intact else None, extra)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}-{tmp.name[-8:]}")
            path.rename(old)
        tmp.rename(path)
        if old is not None:  # the previous cache (_check_replaceable): gone now
            _remove(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sizes


def _check_replaceable(path: Path) -> None:
    """Refuse to replace a file, or a directory holding anything but a cache's files (an
    empty directory, or a cache whose files fail their checks, may be replaced)."""
    if not path.exists() and not path.is_symlink():
        return
    fix = (
        "save_compile_cache never replaces what it did not write: pass a new or empty "
        "directory (e.g. 'compile-cache'), or move that away first"
    )
    if not path.is_dir():
        raise ShapeBucketError(f"compile cache {str(path)!r} is a file, not a cache; {fix}")
    files, _ = read_manifest(path, any_torch=True)
    known = {MANIFEST, ARTIFACTS, INDUCTOR, *(files or ())}
    foreign = sorted(f.name for f in path.iterdir() if f.name not in known)
    if (path / INDUCTOR).exists() and not (path / INDUCTOR).is_dir():
        foreign.append(INDUCTOR)
    if foreign:
        raise ShapeBucketError(
            f"compile cache {str(path)!r} holds {len(foreign)} entr"
            f"{'y' if len(foreign) == 1 else 'ies'} no cache has ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); {fix}"
        )


def _remove_leftovers(path: Path, locked: bool) -> None:
    """Remove what killed saves of ``path`` left beside it (``.<name>.saving-*``,
    ``.<name>.old-*``): all of it under the lock, else what is :data:`STALE_S` old."""
    now = time.time()
    # the exact names _save makes (mkdtemp's 8 characters), not another cache's leftovers
    ours = re.compile(rf"\.{re.escape(path.name)}\.(saving-|old-[0-9]+-)[a-z0-9_]{{8}}")
    for left in path.parent.glob(f".{glob.escape(path.name)}.*"):
        if not ours.fullmatch(left.name):
            continue
        try:
            stale = locked or now - left.lstat().st_mtime > STALE_S
        except OSError:  # gone meanwhile
            continue
        if stale:
            _remove(left)


def _remove(old: Path) -> None:
    """Remove what a save moved aside, a tree or a file; a failure does not fail the save."""
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            old.unlink()


def _build(tmp: Path, previous: Path | None, extra: dict[str, bytes]) -> dict[str, int]:
    """Write a complete cache into the empty directory ``tmp``, its manifest last."""
    sizes = {"artifacts_bytes": 0, "inductor_bytes": 0}
    _write_extra(tmp, previous, extra)
    data = compat.save_cache_artifacts()
    if data is not None:
        _write_bytes(tmp / ARTIFACTS, data)
        sizes["artifacts_bytes"] = len(data)
    elif previous is not None and (previous / ARTIFACTS).is_file():
        _copy_file(str(previous / ARTIFACTS), str(tmp / ARTIFACTS))
    dst = tmp / INDUCTOR
    _copy_inductor(Path(compat.inductor_cache_dir()), dst)
    if previous is not None:
        _copy_inductor(previous / INDUCTOR, dst)
    if dst.is_dir():
        sizes["inductor_bytes"] = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    files = sorted(f for f in tmp.rglob("*") if f.is_file())
    manifest = {
        "torch": torch.__version__,
        "files": {
            f.relative_to(tmp).as_posix(): {"bytes": f.stat().st_size, "sha256": sha256(f)}
            for f in files
        },
    }
    _write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
    return sizes


def _check_extra(extra: Any) -> dict[str, bytes]:
    """``extra`` as a dict of plain file names to bytes, or a ShapeBucketError."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ShapeBucketError(
            f"save_compile_cache(extra=...) must map file names to bytes, got {extra!r:.80}"
        )
    reserved = (ARTIFACTS, MANIFEST, INDUCTOR)
    for name, data in extra.items():
        plain = isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name)
        if not plain or name.lower() in reserved:
            raise ShapeBucketError(
                f"save_compile_cache(extra=...): file name {name!r:.80} must be one plain name "
                f"(letters, digits, '_', '.', '-', at most 100; not {', '.join(reserved)}), "
                "e.g. 'aot.bin'"
            )
        if not isinstance(data, (bytes, bytearray)):
            raise ShapeBucketError(
                f"save_compile_cache(extra=...): extra[{name!r}] must be bytes, got "
                f"{type(data).__name__}"
            )
    return dict(extra)


def _write_extra(tmp: Path, previous: Path | None, extra: dict[str, bytes]) -> None:
    """The ``extra`` files, and the previous cache's own extra files it does not name."""
    for name, data in extra.items():
        _write_bytes(tmp / name, data)
    if previous is None:
        return
    for f in sorted(previous.iterdir()):
        if f.is_file() and f.name not in (ARTIFACTS, MANIFEST) and f.name not in extra:
            _copy_file(str(f), str(tmp / f.name))


def _copy_inductor(src: Path, dst: Path) -> None:
    """Copy inductor's files from ``src`` into ``dst`` (keeping a file ``dst`` has) but its
    locks, temporary files and :data:`UNSAVED_DIRS`."""
    if not src.is_dir():
        return
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if not f.is_file():
            continue
        if any(p.endswith(".lock") or ".tmp" in p or p in UNSAVED_DIRS for p in rel.parts):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (dst / rel).exists():  # kept, as load_compile_cache keeps it
            _copy_file(str(f), str(dst / rel))

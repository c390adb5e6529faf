"""Saving what the compiler built: atomically, beside the previous cache, under the lock.

:func:`save_compile_cache` builds the whole cache (the format :mod:`.load` reads and
checks) in a temporary directory next to ``path`` and renames it into place only
when complete, so an interrupted save leaves the previous cache (or none), never a
half-written one; the previous cache is moved aside to ``.<name>.old-*`` for the
rename and removed after it. What a killed save left (those two) is removed by the next
save of ``path``, under the lock (:func:`_remove_leftovers`). Only a cache is ever replaced: a file, or a directory
holding anything a cache does not, at ``path`` is refused (:func:`_check_replaceable`).
A save holds the cache's lock (:func:`~shapebucket.compile.lock.cache_lock`, the one
prewarm's ``Cache`` takes), so saves racing on one path take turns.
"""

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
    copy_new,
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

__all__ = [
    "save_compile_cache",
    "save_held_compile_cache",
    "save_new_compile_cache",
]


def _copy_new(src: str, dst: str) -> None:
    """:func:`~.load.copy_new` through :func:`_copy_file`: a file the cache has is kept."""
    copy_new(src, dst, _copy_file)


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
    ``path`` (:func:`~shapebucket.compile.lock.cache_lock`, at most ``WAIT_S`` seconds).

    >>> sizes = save_compile_cache("compile-cache")  # doctest: +SKIP
    >>> sorted(sizes)  # doctest: +SKIP
    ['artifacts_bytes', 'inductor_bytes']

    (Not run as a doctest: it copies this machine's whole inductor cache;
    ``tests/test_compile_cache.py`` runs it.)
    """
    extra = _check_extra(extra)
    _check_replaceable(Path(path))  # before waiting on the lock; again under it
    with cache_lock(path):
        return _save(Path(path), None, extra, locked=LOCKS)


def save_held_compile_cache(
    path: str | Path, extra: Mapping[str, bytes] | None = None
) -> dict[str, int]:
    """:func:`save_compile_cache` for a caller that already holds ``path``'s
    :func:`~shapebucket.compile.lock.cache_lock` (prewarm's ``Cache``): a second lock on
    the same file in one process would wait for itself."""
    return _save(Path(path), None, _check_extra(extra), locked=LOCKS)


def save_new_compile_cache(path: str | Path, exported: set[str]) -> dict[str, int]:
    """Like :func:`save_compile_cache`, with only what is new: the artifacts recorded since
    the last save (cleared after each) and the inductor files not in ``exported`` (their
    paths relative to inductor's cache directory; the ones saved now are added to it).
    Used by the background compile to publish one shape at a time."""
    return _save(Path(path), exported, {}, locked=False)


def _save(
    path: Path, exported: set[str] | None, extra: dict[str, bytes], *, locked: bool
) -> dict[str, int]:
    _check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(path, locked)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.saving-", dir=path.parent))
    try:
        if exported is None:
            sizes = _build(
                tmp, previous=path if check_compile_cache(path) is None else None, extra=extra
            )
        else:
            sizes = _build(tmp, previous=None, exported=exported)
            compat.clear_cache_artifacts()
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
    """Refuse to replace what is not a compile cache: a file (a mistyped ``"model.pt"``),
    or a directory holding anything but a cache's files (``manifest.json``,
    ``artifacts.bin``, ``inductor/``, and the extra files its manifest names). An empty
    directory, or a cache whose files fail their checks, may be replaced."""
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
    """Remove what killed saves of ``path`` left beside it: ``.<name>.saving-*`` (a cache
    being written) and ``.<name>.old-*`` (a previous cache moved aside). Under the cache's
    lock every one is stale (each save of ``path`` holds the lock, and the kernel freed a
    killed saver's), so all go; without it (no ``fcntl``, or the background's one-shape
    publishing) only those untouched for :data:`STALE_S` seconds, which no running save
    is still writing."""
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
    """Remove what a save moved aside: a directory tree, or a plain file (``rmtree``
    alone skipped a file, which stayed as ``.<key>.old-*`` for good). The new cache is in
    place by now, so a leftover that cannot be removed does not fail the save."""
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            old.unlink()


def _build(
    tmp: Path,
    previous: Path | None,
    exported: set[str] | None = None,
    extra: dict[str, bytes] | None = None,
) -> dict[str, int]:
    """Write a complete cache into the empty directory ``tmp``, its manifest last (with
    ``exported``: only the inductor files not in it, which are then added to it)."""
    sizes = {"artifacts_bytes": 0, "inductor_bytes": 0}
    _write_extra(tmp, previous, extra or {})
    data = compat.save_cache_artifacts()
    if data is not None:
        _write_bytes(tmp / ARTIFACTS, data)
        sizes["artifacts_bytes"] = len(data)
    elif previous is not None and (previous / ARTIFACTS).is_file():
        _copy_file(str(previous / ARTIFACTS), str(tmp / ARTIFACTS))
    skip = shutil.ignore_patterns("*.lock", "*.tmp*", *UNSAVED_DIRS)
    sources = [Path(compat.inductor_cache_dir())]
    if previous is not None:
        sources.append(previous / INDUCTOR)
    dst = tmp / INDUCTOR
    if exported is not None:
        _copy_unexported(sources[0], dst, exported)
        sources = []
    for src in sources:
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=skip, copy_function=_copy_new)
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


def _copy_unexported(src: Path, dst: Path, exported: set[str]) -> None:
    """Copy the files of ``src`` whose relative path is not in ``exported`` (no locks, no
    temporary files), and add them to it."""
    if not src.is_dir():
        return
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src).as_posix()
        if not f.is_file() or rel in exported or f.name.endswith(".lock") or ".tmp" in f.name:
            continue
        if UNSAVED_DIRS.intersection(f.relative_to(src).parts[:-1]):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        _copy_file(str(f), str(dst / rel))
        exported.add(rel)

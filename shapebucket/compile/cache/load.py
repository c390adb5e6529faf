"""Reading a saved compile cache: its format (:data:`ARTIFACTS`, :data:`INDUCTOR`, the
extra files, :data:`MANIFEST` with the torch version and every file's size and SHA-256),
the check of every file, and loading it."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from ... import _torch as compat

MANIFEST = "manifest.json"
ARTIFACTS = "artifacts.bin"
INDUCTOR = "inductor"

__all__ = [
    "ARTIFACTS",
    "INDUCTOR",
    "MANIFEST",
    "check_compile_cache",
    "load_compile_cache",
    "read_manifest",
    "sha256",
]


def _copy_new(src: str, dst: str) -> None:
    """Copy a file unless ``dst`` exists. Inductor's cache is content-addressed (a file's
    name is its key), and overwriting a compiled ``.so`` that a process has loaded corrupts
    that process's mapping of it (seen as a crash at exit)."""
    if not Path(dst).exists():
        shutil.copy2(src, dst)


def sha256(path: Path) -> str:
    """The SHA-256 of a file, as the manifest records it."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _refuse(path: Path, why: str) -> bool:
    warnings.warn(
        f"compile cache {str(path)!r} ignored: {why}; compiling from scratch. Save it again with "
        "save_compile_cache() after this run",
        stacklevel=3,
    )
    return False


def read_manifest(
    path: Path, any_torch: bool = False
) -> tuple[dict[str, tuple[int, str]] | None, str]:
    """The manifest's files as ``{name: (bytes, sha256)}``, or None and why not (with
    ``any_torch``, also a manifest another torch version wrote)."""
    try:
        manifest: Any = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None, f"its {MANIFEST} is missing or unreadable"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return None, f"its {MANIFEST} has no 'files' mapping"
    version = manifest.get("torch")
    if version != torch.__version__ and not any_torch:
        return None, f"it was saved by torch {version}, this is torch {torch.__version__}"
    files: dict[str, tuple[int, str]] = {}
    for name, meta in manifest["files"].items():
        size = meta.get("bytes") if isinstance(meta, dict) else None
        digest = meta.get("sha256") if isinstance(meta, dict) else None
        bad_size = not isinstance(size, int) or isinstance(size, bool) or size < 0
        if bad_size or not isinstance(digest, str):
            return None, f"its {MANIFEST} entry for {name!r} is malformed ({meta!r})"
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return None, f"its {MANIFEST} names a file outside the cache ({name!r})"
        files[name] = (int(size), digest)  # type: ignore[arg-type]  # an int, checked above
    return files, ""


def check_compile_cache(path: str | Path) -> str | None:
    """Why the cache at ``path`` cannot be loaded (no manifest, another torch, a missing,
    changed or added file), or None when it is complete and intact. Reads only.

    >>> check_compile_cache("no-such-cache")
    'its manifest.json is missing or unreadable'
    """
    path = Path(path)
    files, why = read_manifest(path)
    if files is None:
        return why
    for name, (size, digest) in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, {size} were saved (truncated?)"
        if sha256(f) != digest:
            return f"{name} does not match its checksum (corrupt or edited)"
    present = {f.relative_to(path).as_posix() for f in path.rglob("*") if f.is_file()}
    extra = sorted(present - set(files) - {MANIFEST})
    if extra:
        return f"{len(extra)} file(s) not in its {MANIFEST} ({', '.join(extra[:3])})"
    return None


def load_compile_cache(path: str | Path) -> bool:
    """Restore a cache written by :func:`save_compile_cache`; call before the first compile.

    Returns False (and changes nothing) when ``path`` holds no cache. A cache that
    fails its manifest (a missing, truncated, changed or added file, a malformed
    field, another torch version, no manifest) or whose artifacts the compiler
    cannot read is ignored with a warning, and nothing of it is copied: the run
    compiles from scratch.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     load_compile_cache(tmp)  # an empty directory holds no cache
    False
    """
    path = Path(path)
    has_artifacts = (path / ARTIFACTS).is_file()
    has_inductor = (path / INDUCTOR).is_dir()
    if not has_artifacts and not has_inductor:
        return False
    why = check_compile_cache(path)
    if why is not None:
        return _refuse(path, why)
    if has_artifacts:
        try:
            loaded = compat.load_cache_artifacts((path / ARTIFACTS).read_bytes())
        except Exception as e:  # the compiler's own format: any failure means unusable
            return _refuse(
                path, f"the compiler could not read {ARTIFACTS} ({type(e).__name__}: {e})"
            )
        if not loaded:
            return _refuse(path, f"the compiler could not read {ARTIFACTS}")
    if has_inductor:
        dst = Path(compat.inductor_cache_dir())
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copytree(path / INDUCTOR, dst, dirs_exist_ok=True, copy_function=_copy_new)
    return True

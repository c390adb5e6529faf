"""Persist what the compiler built, and load it back before the first compile."""

from __future__ import annotations

import shutil
from pathlib import Path

from . import _torch_compat as compat

__all__ = ["load_compile_cache", "save_compile_cache"]


def _copy_new(src: str, dst: str) -> None:
    """Copy a file unless ``dst`` exists. Inductor's cache is content-addressed (a
    file's name is its key), and overwriting a compiled ``.so`` that a process has
    loaded corrupts that process's mapping of it (seen as a crash at exit)."""
    if not Path(dst).exists():
        shutil.copy2(src, dst)


def save_compile_cache(path: str | Path) -> dict[str, int]:
    """Persist what the compiler built in this process to directory ``path``.

    Writes the compiler's cache artifacts (``torch.compiler.save_cache_artifacts``,
    torch >= 2.7) and a copy of inductor's cache directory (compiled kernels and
    FX graphs; on CPU this is what saves the most time). Returns byte counts.

    >>> sizes = save_compile_cache("compile-cache")  # doctest: +SKIP
    >>> sorted(sizes)  # doctest: +SKIP
    ['artifacts_bytes', 'inductor_bytes']

    (Not run as a doctest: it copies this machine's whole inductor cache;
    ``tests/test_compile.py`` runs it.)
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    data = compat.save_cache_artifacts()
    sizes = {"artifacts_bytes": 0, "inductor_bytes": 0}
    if data is not None:
        (path / "artifacts.bin").write_bytes(data)
        sizes["artifacts_bytes"] = len(data)
    src = Path(compat.inductor_cache_dir())
    if src.is_dir():
        dst = path / "inductor"
        skip = shutil.ignore_patterns("*.lock", "*.tmp*")
        shutil.copytree(src, dst, dirs_exist_ok=True, ignore=skip, copy_function=_copy_new)
        sizes["inductor_bytes"] = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    return sizes


def load_compile_cache(path: str | Path) -> bool:
    """Restore a cache written by :func:`save_compile_cache`; call before the first compile.

    Returns False (and changes nothing) when ``path`` holds no cache.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     load_compile_cache(tmp)  # an empty directory holds no cache
    False
    """
    path = Path(path)
    found = False
    if (path / "artifacts.bin").is_file():
        compat.load_cache_artifacts((path / "artifacts.bin").read_bytes())
        found = True
    if (path / "inductor").is_dir():
        dst = Path(compat.inductor_cache_dir())
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copytree(path / "inductor", dst, dirs_exist_ok=True, copy_function=_copy_new)
        found = True
    return found

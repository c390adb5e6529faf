"""Persist what the compiler built, and load it back before the first compile.

A saved cache carries ``manifest.json``: the torch version and the size and
SHA-256 of every file. :func:`load_compile_cache` checks all of it before it
copies anything into the live inductor cache, so a truncated, edited or
foreign cache is refused with a warning instead of being half-installed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .. import _torch_compat as compat

MANIFEST = "manifest.json"

__all__ = ["describe_batch", "job_key", "load_compile_cache", "save_compile_cache"]


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
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.name != MANIFEST)
    manifest = {
        "torch": torch.__version__,
        "files": {
            f.relative_to(path).as_posix(): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
            for f in files
        },
    }
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return sizes


def _sha256(path: Path) -> str:
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


def _check(path: Path) -> str | None:
    """Why the cache at ``path`` cannot be used, or None when every file is intact."""
    try:
        manifest: Any = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        version = manifest["torch"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MANIFEST} is missing or unreadable"
    if version != torch.__version__:
        return f"it was saved by torch {version}, this is torch {torch.__version__}"
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, {meta['bytes']} were saved (truncated?)"
        if _sha256(f) != meta["sha256"]:
            return f"{name} does not match its checksum (corrupt or edited)"
    return None


def load_compile_cache(path: str | Path) -> bool:
    """Restore a cache written by :func:`save_compile_cache`; call before the first compile.

    Returns False (and changes nothing) when ``path`` holds no cache. A cache that
    fails its manifest (a missing, truncated or changed file, another torch
    version, no manifest) or that the compiler cannot read is ignored with a
    warning, and nothing of it is copied: the run compiles from scratch.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     load_compile_cache(tmp)  # an empty directory holds no cache
    False
    """
    path = Path(path)
    has_artifacts = (path / "artifacts.bin").is_file()
    has_inductor = (path / "inductor").is_dir()
    if not has_artifacts and not has_inductor:
        return False
    why = _check(path)
    if why is not None:
        return _refuse(path, why)
    if has_artifacts:
        try:
            compat.load_cache_artifacts((path / "artifacts.bin").read_bytes())
        except Exception as e:  # the compiler's own format: any failure means unusable
            return _refuse(
                path, f"the compiler could not read artifacts.bin ({type(e).__name__}: {e})"
            )
    if has_inductor:
        dst = Path(compat.inductor_cache_dir())
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copytree(path / "inductor", dst, dirs_exist_ok=True, copy_function=_copy_new)
    return True


def _code_text(code: Any) -> str:
    """A code object's bytecode, names and constants (nested code objects included)."""
    consts = [_code_text(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
    return " ".join([code.co_code.hex(), repr(code.co_names), *consts])


def _function_code(f: Any) -> str:
    code = getattr(f, "__code__", None)
    return _code_text(code) if code is not None else repr(type(f))


def _class_code(cls: type) -> str:
    """What defines a class that has no source file (a notebook cell, ``exec``'d code):
    its name and the code of every function it and its bases define."""
    parts = []
    for klass in cls.__mro__:
        if klass.__module__ in ("builtins", "torch.nn.modules.module"):
            continue
        parts.append(f"{klass.__module__}.{klass.__qualname__}")
        for name, attr in sorted(vars(klass).items()):
            attr = getattr(attr, "__func__", attr)  # staticmethod, classmethod
            if callable(attr) or isinstance(attr, property):
                fget = getattr(attr, "fget", attr)
                parts.append(f"{name}: {_function_code(fget)}")
    return "\n".join(parts)


def _code_of(obj: Any) -> list[str]:
    """Source files (or code) that define what ``obj`` computes."""
    import inspect

    out: list[str] = []
    modules = []
    if isinstance(obj, torch.nn.Module):
        modules = [getattr(m, "_orig_mod", m) for m in obj.modules()]
    targets: list[Any] = [type(m) for m in modules] if modules else [obj]
    for t in targets:
        try:
            path = inspect.getsourcefile(t)
        except TypeError:
            path = None
        if path and Path(path).is_file():
            out.append(Path(path).read_text(errors="replace"))
        elif isinstance(t, type):
            out.append(_class_code(t))
        else:
            f = getattr(t, "__wrapped__", t)
            out.append(_function_code(f) if hasattr(f, "__code__") else _class_code(type(f)))
    return sorted(set(out))


def describe_batch(batch: Any) -> Any:
    """What the compiler guards on, per tensor of a (nested) batch: shape, dtype, device, strides.

    >>> describe_batch({"x": torch.ones(2, 3)})
    [('x', ((2, 3), 'torch.float32', 'cpu', (3, 1)))]
    """
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape), str(batch.dtype), str(batch.device), batch.stride())
    if isinstance(batch, dict):
        return sorted((str(k), describe_batch(v)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return [describe_batch(v) for v in batch]
    return type(batch).__name__


def job_key(
    model: Any,
    step: Any,
    batches: Mapping[Any, Any],
    extra: str = "",
    *,
    described: bool = False,
) -> str:
    """A key for one prewarm job's compile cache: what invalidates compiled code.

    It hashes the torch version, the devices, the code of every module class of
    ``model`` (its source file, or for a class without one, such as a notebook's,
    its name and bytecode) and of ``step``, every prewarmed batch's shapes,
    dtypes, devices and strides (``batches`` maps a name to a batch, or to
    :func:`describe_batch` of it with ``described=True``), and ``extra`` (put
    the compile options there: mode, backend, ``fullgraph``). A change in any of
    them gives another key, so a stale cache is never loaded for a changed job.

    >>> a = job_key(torch.nn.Linear(2, 2), None, {8: torch.ones(2, 8)})
    >>> a == job_key(torch.nn.Linear(2, 2), None, {8: torch.ones(2, 8)}), len(a)
    (True, 16)
    >>> a == job_key(torch.nn.Linear(2, 2), None, {16: torch.ones(2, 16)})
    False
    """
    h = hashlib.sha256()
    devices = sorted(
        {str(p.device) for p in model.parameters()} if isinstance(model, torch.nn.Module) else []
    )
    if torch.cuda.is_available() and any(d.startswith("cuda") for d in devices):
        devices.append(torch.cuda.get_device_name())
    shapes = {str(k): v if described else describe_batch(v) for k, v in batches.items()}
    parts = [
        torch.__version__,
        repr(devices),
        *_code_of(model),
        *(_code_of(step) if step is not None else []),
        repr(sorted(shapes.items())),
        extra,
    ]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]

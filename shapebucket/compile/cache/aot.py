"""Ahead-of-time compiled calls kept with the cache: :class:`AotCache` and the ``forward``
(:class:`AotForward`) that runs them where their guards accept a call, dynamo otherwise
(``docs/compile.md``, "Ahead of time")."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ... import _torch as compat
from ...errors import ShapeBucketError
from ..messages import is_recompile_error
from ..modes.base import Job
from ..modes.cached import Cache

__all__ = ["AotCache", "AotForward", "installed"]

AOT_FILE = "aot.bin"


class AotForward:
    """The ``forward`` of a ``torch.compile``'d module under :class:`AotCache`.

    ``functions``: ahead-of-time compiled functions (the first ``loaded`` of them read
    from a cache); ``job``: the prewarm that installed or reused it, until it finishes.
    While ``compiling()``, ``used[shape]`` collects what ran each call of ``shape``: a kind
    (``"aot-cache"``, ``"aot"``, ``"dynamo"``) and the function's index.
    """

    def __init__(self, compiled: Any, functions: list[Any]):
        self.compiled = compiled
        self.module = compat.unwrap_compiled(compiled)
        self.original = compiled.forward  # the module's own dynamo forward
        self.functions = list(functions)
        self.loaded = len(functions)
        self.job: Job | None = None
        self.failed: str | None = None
        self.used: dict[Any, set[tuple[str, int]]] = {}  # shape -> (kind, function) that ran
        self._last: dict[Any, int] = {}  # a call's tensor shapes -> the function that ran it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if compat.has_hooks(self.compiled):  # hooks added since: only dynamo runs them
            return self.original(*args, **kwargs)
        key = _shapes(args, kwargs)
        order = [self._last[key]] if key in self._last else []
        for i in [*order, *(j for j in range(len(self.functions)) if j not in order)]:
            out = compat.aot_call(self.functions[i], self.module, args, kwargs)
            if out is not compat.AOT_MISS:
                self._last[key] = i
                return self._count("aot-cache" if i < self.loaded else "aot", i, out)
        if self.compiling() and self.failed is None:
            try:
                fn = compat.aot_compile_call(self.compiled, args, kwargs)
            except Exception as e:  # a graph break, an unsupported op: dynamo as before
                self.failed = (
                    f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                )
                warnings.warn(
                    f"AotCache: ahead-of-time compiling a call of the model failed "
                    f"({self.failed}); this and every later call compile through dynamo as "
                    "with Cache (which still saves their compiled code)",
                    stacklevel=3,
                )
            else:
                self.functions.append(fn)
                self._last[key] = len(self.functions) - 1
                out = compat.aot_call(fn, self.module, args, kwargs)
                if out is compat.AOT_MISS:  # its own function must accept the call it was for
                    raise ShapeBucketError(
                        "AotCache: a call's own ahead-of-time compiled function rejected it; "
                        "use Cache(dir) instead (and report this)"
                    )
                return self._count("aot", len(self.functions) - 1, out)
        try:
            out = self.original(*args, **kwargs)
        except RuntimeError as e:  # under no_recompiles: dynamo, never run here, has no
            if is_recompile_error(e) and self._last:  # guard failure to name; we do
                raise ShapeBucketError(self._unplanned(key)) from e
            raise
        return self._count("dynamo", -1, out)

    def _unplanned(self, key: tuple[Any, ...]) -> str:
        planned = "; ".join(sorted({_describe(k) for k in self._last}))
        return (
            f"no_recompiles: a call with {_describe(key)} matches none of the calls "
            f"AotCache compiled or loaded ({planned}) and may not compile: a shape that was "
            "not prewarmed. Prewarm every shape the loader makes (ShapePlan.of(collator, "
            "sampler)), or make this call outside no_recompiles()"
        )

    def compiling(self) -> bool:
        """Whether a call no function accepts is compiled ahead of time now: while prewarm
        compiles its shapes (not in its verify pass, nor after it)."""
        return self.job is not None and self.job.shape is not None

    def _count(self, kind: str, index: int, out: Any) -> Any:
        if self.job is not None and self.job.shape is not None:
            self.used.setdefault(self.job.shape, set()).add((kind, index))
        return out


def _shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A call's tensors' shapes, to try the function that last ran such a call first."""
    out: list[Any] = []
    for name, value in [*enumerate(args), *sorted(kwargs.items())]:
        shape = getattr(value, "shape", None)
        if isinstance(shape, (tuple, torch.Size)):
            out.append((name, tuple(shape)))
        else:
            out.append((name, type(value).__name__))
    return tuple(out)


def _describe(key: tuple[Any, ...]) -> str:
    return ", ".join(f"{n} {list(v) if isinstance(v, tuple) else v}" for n, v in key)


def installed(compiled: Any) -> AotForward | None:
    """The :class:`AotForward` installed on ``compiled``, if any."""
    forward = vars(compiled).get("forward") if hasattr(compiled, "__dict__") else None
    return forward if isinstance(forward, AotForward) else None


@dataclass(frozen=True)
class AotCache(Cache):
    """:class:`~shapebucket.compile.Cache`, plus every call prewarm makes compiled
    ahead of time and kept with the cache (``aot.bin``), so that the next run loads whole
    graphs and traces nothing (see this module's docstring, and ``docs/compile.md``).

    ``report.how[shape]`` is ``"aot-cache"`` (loaded, or held from an earlier prewarm of
    the module), ``"aot"`` (compiled ahead of time now) or, for a shape whose calls went
    through dynamo, what ``Cache`` says. Refused with ``CudaGraphs``, and beside another
    ``Cache``.
    """

    def setup(self, job: Job) -> None:
        if not compat.is_compiled_module(job.model):  # before the lock and the load
            raise ShapeBucketError(
                f"AotCache needs the torch.compile'd module itself as prewarm's model, got "
                f"{type(job.model).__name__}; pass model = torch.compile(module, dynamic=False), "
                "or use Cache(dir)"
            )
        if compat.has_hooks(job.model):
            raise ShapeBucketError(
                "AotCache: the module has forward or backward hooks (its own or global ones), "
                "which an ahead-of-time compiled forward would skip; remove them or use Cache(dir)"
            )
        super().setup(job)
        functions = _load(Path(job.memo["cache_path"]), bool(job.report.cache_loaded))
        forward = installed(job.model)
        job.memo["aot_new"] = forward is None  # a failure takes only ours back (scope)
        if forward is None:
            forward = job.model.forward = AotForward(job.model, functions)
        elif not forward.functions:
            forward.functions, forward.loaded = list(functions), len(functions)
        else:  # a later prewarm of this module: what it holds counts as ready, like a load
            forward.loaded = len(forward.functions)
        forward.job, forward.used = job, {}
        job.memo["aot"] = forward

    @contextlib.contextmanager
    def scope(self, job: Job) -> Iterator[None]:
        try:
            yield
        except BaseException:
            forward = job.memo.get("aot")
            if forward is not None:
                forward.job = None  # a later call runs as after a finished prewarm
                if job.memo.get("aot_new"):  # left as it was
                    job.model.forward = forward.original
            raise

    def finish(self, job: Job) -> None:
        forward: AotForward = job.memo["aot"]
        forward.job = None  # from here on, a call no function accepts: dynamo
        for shape, ran in forward.used.items():
            kinds = {kind for kind, _ in ran}
            functions = {i for kind, i in ran if kind != "dynamo"}
            if kinds <= {"aot-cache", "aot"}:
                job.report.how[shape] = "aot" if "aot" in kinds else "aot-cache"
                job.report.graphs[shape] = max(job.report.graphs.get(shape, 0), len(functions))
        super().finish(job)  # saves, with extra_files

    def extra_files(self, job: Job) -> dict[str, bytes]:
        forward: AotForward = job.memo["aot"]
        if len(forward.functions) == forward.loaded:  # nothing compiled in this process
            return {}
        return {AOT_FILE: compat.aot_serialize(forward.functions)}


def _load(path: Path, loaded: bool) -> list[Any]:
    """The functions a cache that loaded (its manifest checked every byte) holds."""
    file = path / AOT_FILE
    if not loaded or not file.is_file():
        return []
    try:
        return compat.aot_deserialize(file.read_bytes())
    except Exception as e:  # another torch's or a foreign pickle: compile them again
        warnings.warn(
            f"AotCache: {file} could not be loaded ({type(e).__name__}: {e}); compiling its "
            "calls again",
            stacklevel=4,
        )
        return []

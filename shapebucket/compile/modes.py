"""Modes: small parts that change how :func:`~shapebucket.prewarm` makes its graphs.

``prewarm(model, plan, example, modes=(Specialize(), Cache("compile-cache")))``.
Each mode is a frozen dataclass with up to six hooks, all optional, each
testable alone with a :class:`Job`:

* ``scope(job)``: the block the whole job (compiles and verify pass) runs in,
  exited also on error (raise the recompile limit, put it back);
* ``setup(job)``: once, before the first shape (load a cache);
* ``prepare(batch, shape, job)``: each prewarm batch before it runs (mark dims);
* ``context()``: the block every run of a batch happens in (``inference_mode``);
* ``runs``: how many times each prewarm batch runs (CUDA graphs record on the third);
* ``finish(job)``: once, after every shape compiled (save the cache);
* ``retry(error, job)``: a run of a prepared batch raised ``error``: return True to
  prepare the batch again and rerun it (Specialize tries another marked dim).

``how`` (a class attribute) is what ``report.how`` says for every shape when
the mode decides it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from .. import _torch_compat as compat
from .._validate import check_flag, check_int, check_number
from ..errors import ShapeBucketError
from ..plan.shapes import Shape, ShapePlan
from .cache import load_compile_cache, save_held_compile_cache
from .key import describe_batch, job_key
from .lock import WAIT_S, cache_lock
from .recompiles import walk_batch
from .report import PrewarmReport

__all__ = [
    "Cache",
    "CudaGraphs",
    "Inference",
    "Job",
    "Mode",
    "RecompileLimit",
    "Repeat",
    "Specialize",
]


@dataclass
class Job:
    """What a mode sees of one :func:`~shapebucket.prewarm` call."""

    model: Any
    step: Callable[[Any], Any] | None
    plan: ShapePlan
    example: Any
    report: PrewarmReport
    modes: tuple[Mode, ...] = ()
    memo: dict[str, Any] = field(default_factory=dict)
    phase: str = "compile"  # then "verify": the verify pass's runs (prewarm sets it)

    def batch(self, shape: Shape) -> Any:
        """A fresh batch of ``shape`` (``plan.batch(example, shape)``)."""
        return self.plan.batch(self.example, shape)


@dataclass(frozen=True)
class Mode:
    """A part of prewarm; every hook does nothing by default."""

    how: ClassVar[str | None] = None

    @property
    def runs(self) -> int:
        """How many times each prewarm batch runs."""
        return 1

    def scope(self, job: Job) -> contextlib.AbstractContextManager[Any]:
        """The block the whole job runs in (entered before ``setup``, exited last, also
        on error)."""
        return contextlib.nullcontext()

    def setup(self, job: Job) -> None:
        """Called once before the first shape."""

    def prepare(self, batch: Any, shape: Shape, job: Job) -> Any:
        """Called on each prewarm batch before it runs; returns the batch to run."""
        return batch

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """The block every run (prewarm's and the verify pass's) happens in."""
        return contextlib.nullcontext()

    def finish(self, job: Job) -> None:
        """Called once after every shape compiled (not after an error)."""

    def retry(self, error: BaseException, job: Job) -> bool:
        """A run of a batch this mode prepared raised ``error``: True to prepare the batch
        again and rerun it, False to let the error through."""
        return False


@dataclass(frozen=True)
class RecompileLimit(Mode):
    """The recompile-limit policy (the default one is ``RecompileLimit()``).

    A plan with more shapes than the compiler's recompile limit needs one graph
    per shape, so the limit is raised globally to the number of shapes for the
    prewarm (torch sets a per-function limit only at ``torch.compile(...,
    recompile_limit=N)``) and put back afterwards, also on error: the graphs stay
    usable (the limit caps new compiles, not the use of compiled ones).
    ``raise_limit=False`` raises :class:`ShapeBucketError` instead.

    >>> plan = ShapePlan.from_function([(1, 4), (1, 8)], lambda s: torch.ones(s.rows, s.length))
    >>> job = Job(None, None, plan, None, PrewarmReport(plan.shapes))
    >>> with RecompileLimit().scope(job):
    ...     compat.get_recompile_limit() >= 2 and job.report.limit >= 2
    True
    """

    raise_limit: bool = True

    def __post_init__(self) -> None:
        check_flag("RecompileLimit(raise_limit)", self.raise_limit)

    @contextlib.contextmanager
    def scope(self, job: Job) -> Iterator[None]:
        n, limit = len(job.plan), compat.get_recompile_limit()
        if n > limit and not self.raise_limit:
            raise ShapeBucketError(
                f"{n} shapes exceed the compiler's recompile limit of {limit}; compile with "
                f"{compat.recompile_limit_fix(n)}, drop RecompileLimit(raise_limit=False), "
                "or use fewer buckets"
            )
        with compat.raised_recompile_limit(n) as raised_from:
            job.report.limit_raised_from = raised_from
            job.report.limit = max(n, limit)
            yield


@dataclass(frozen=True)
class Inference(Mode):
    """Run forward only, under ``torch.inference_mode()`` (no backward, no optimizer).

    Serve under ``torch.inference_mode()`` too, as the compiled graphs guard on
    it, with batches made outside it (a tensor created inside inference mode is
    guarded as another kind of input).

    >>> with Inference().context():
    ...     torch.is_inference_mode_enabled()
    True
    """

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.inference_mode()


@dataclass(frozen=True)
class Repeat(Mode):
    """Run each prewarm batch ``n`` times.

    >>> Repeat(3).runs
    3
    """

    n: int = 1

    def __post_init__(self) -> None:
        check_int("Repeat(n)", self.n, minimum=1)

    @property
    def runs(self) -> int:
        return self.n


@dataclass(frozen=True)
class CudaGraphs(Mode):
    """For ``torch.compile(mode="reduce-overhead")``: cudagraph trees record a shape's CUDA
    graph only after warm-up runs, so each prewarm batch runs ``repeat`` times (warm-up,
    record, replay). On CUDA ``report.memory_mb`` gives the memory each shape kept, its
    graph's pool included.

    >>> CudaGraphs().runs
    3
    """

    repeat: int = 3

    def __post_init__(self) -> None:
        check_int("CudaGraphs(repeat)", self.repeat, minimum=1)

    @property
    def runs(self) -> int:
        return self.repeat


def length_dims(plan: ShapePlan, make: Callable[[Shape], Any]) -> dict[str, list[int]]:
    """Which dims of which leaves of a batch follow the length: ``{path: [dims]}``.

    Found by making batches at two lengths and keeping the dims equal to each
    length (a ``[B, F, L]`` value, its ``[B, L]`` mask and a ``[B, L, L]``
    block mask alike). With one length: dim ``seq_dim + 1`` of every tensor that
    has it at that size, and dim 1 of every 2-D ``[rows, length]`` tensor.

    >>> plan = ShapePlan.from_function([(2, 8), (2, 16)], lambda s: {"x": torch.ones(s.rows, 3, s.length), "m": torch.ones(s.rows, s.length)})
    >>> length_dims(plan, lambda s: plan.batch(None, s))
    {'x': [2], 'm': [1]}
    """
    lengths = list(plan.lengths)
    a = next(s for s in plan if s.length == lengths[0])
    leaves_a = dict(walk_batch(make(a)))
    out: dict[str, list[int]] = {}
    if len(lengths) >= 2:
        b = next(s for s in plan if s.length == lengths[1])
        leaves_b = dict(walk_batch(make(b)))
        for path, x in leaves_a.items():
            y = leaves_b.get(path)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.ndim == y.ndim:
                dims = [
                    i for i in range(x.ndim) if x.shape[i] == a.length and y.shape[i] == b.length
                ]
                if dims:
                    out[path] = dims
        return out
    d = plan.seq_dim + 1
    for path, x in leaves_a.items():
        if not isinstance(x, torch.Tensor):
            continue
        if x.ndim > d and x.shape[d] == a.length:
            out[path] = [d]
        elif x.ndim == 2 and x.shape[1] == a.length:
            out[path] = [1]
    return out


@dataclass(frozen=True)
class Specialize(Mode):
    """One dynamic graph for every length, with a kernel specialised to each length.

    Every prewarm batch's length dims (of all its tensors: values, masks,
    positions; see :func:`length_dims`) are marked dynamic, the first with
    ``specialize_on`` one predicate per length of the plan, the others plainly
    (they share its size; torch builds no cross product). Torch traces once,
    compiles a kernel per length plus a generic one, so a length no bucket
    covers runs compiled code instead of recompiling. The training loop needs no
    marks; compile the model with ``dynamic=False`` or ``None``.

    Which dim takes the predicates matters to torch: it keeps one source of the
    equal sizes as the graph's input, and a specialisation on another source
    fails inside dynamo (``TensorPropertySource(...) is not in list``). Which one
    it keeps depends on the model (a ``[B, L]`` mask's for ``x * mask[:, None]``,
    a ``[B, F, L]`` value's behind ``transpose`` and ``Linear``), so the first
    shape tries a ``[B, L]`` dim first and, on that error, each other marked dim
    (:meth:`retry`; the failed tries' graphs count in that shape's
    ``report.graphs``). When none works, :class:`ShapeBucketError` says to
    prewarm without ``Specialize()``.
    """

    how: ClassVar[str | None] = "specialised"

    def setup(self, job: Job) -> None:
        if len(job.plan.lengths) < 2:
            raise ShapeBucketError(
                f"Specialize: the plan has one length ({list(job.plan.lengths)}), so there is "
                "nothing to share one dynamic trace between (and no second length to find the "
                "length dim by); prewarm it without Specialize()"
            )
        job.memo["length_dims"] = length_dims(job.plan, job.batch)
        if not job.memo["length_dims"]:
            raise ShapeBucketError(
                f"Specialize: no tensor of the plan's batches changes with the length "
                f"({list(job.plan.lengths)}); build the plan from the collator that made the "
                "example (ShapePlan.of(collator, sampler))"
            )

    def prepare(self, batch: Any, shape: Shape, job: Job) -> Any:
        dims = job.memo.get("length_dims")
        if dims is None:
            dims = job.memo["length_dims"] = length_dims(job.plan, job.batch)
        marks = [
            (leaf, dim)
            for path, leaf in walk_batch(batch)
            if isinstance(leaf, torch.Tensor) and path in dims
            for dim in dims[path]
            if leaf.ndim > dim and leaf.shape[dim] == shape.length
        ]
        if not marks:
            raise ShapeBucketError(
                f"Specialize: no tensor of the batch for shape {tuple(shape)} has length "
                f"{shape.length} where the plan's batches keep it ({dims})"
            )
        # specialize_on goes on one dim only, the others share its size symbol. The compiler
        # keeps one symbol of the equal ones as the graph's input, and a [B, F, L] value's
        # loses to a [B, L] mask's (InternalTorchDynamoError otherwise), so a [B, L] first.
        order = sorted(range(len(marks)), key=lambda i: (marks[i][0].ndim, marks[i][1], i))
        job.memo["specialize_tries"] = len(order)
        first = order[job.memo.get("specialize_on", 0) % len(order)]
        for i, (leaf, dim) in enumerate(marks):
            if i == first:
                compat.mark_dynamic_specialized(leaf, dim, list(job.plan.lengths))
            else:
                compat.mark_dynamic_dim(leaf, dim, strict=True, min=None, max=None)
        return batch

    def retry(self, error: BaseException, job: Job) -> bool:
        """On torch's ``is not in list`` error, put the predicates on the next marked dim."""
        if not compat.is_specialization_source_error(error):
            return False
        tried = job.memo.get("specialize_on", 0) + 1
        if tried >= job.memo.get("specialize_tries", 1):
            raise ShapeBucketError(
                f"Specialize: torch found none of the {tried} length dims it was given "
                "among the graph's inputs (a torch limit of specialize_on, raised as "
                f"{type(error).__name__}: {str(error).splitlines()[0][:160]}); prewarm this "
                "model without Specialize() (one static graph per length)"
            ) from error
        job.memo["specialize_on"] = tried
        return True


_TIMEOUT_HINT = "; pass seconds (the default is 1800), or None to wait as long as the builder takes"


@dataclass(frozen=True)
class Cache(Mode):
    """Keep the compiled code between runs in ``dir/<key>``.

    Loads the cache before the first compile and saves it after compiling
    anything new. The key hashes what invalidates compiled code: torch version,
    devices, the source of the model's module classes and of ``step``, every
    shape's batch (shapes, dtypes, strides), the other modes, and ``extra``
    (put the compile options there: ``"mode=max-autotune fullgraph=True"``).
    A damaged or foreign cache is refused with a warning
    (:func:`~shapebucket.compile.load_compile_cache`). Processes sharing ``dir``
    take turns on a key (:func:`~shapebucket.compile.lock.cache_lock`): the first
    compiles and saves, the others wait (``report.cache_wait_s``; a warning says once
    who holds the lock) and load it. ``timeout`` bounds that wait (seconds; 30 minutes,
    enough for another rank's cold compile of many shapes; ``None``: no limit).
    """

    dir: str | Path = "compile-cache"
    extra: str = ""
    timeout: float | None = WAIT_S

    def __post_init__(self) -> None:
        if not isinstance(self.dir, (str, Path)):
            raise ShapeBucketError(f"Cache(dir) must be a path, got {self.dir!r}")
        if str(self.dir).strip() == "":
            raise ShapeBucketError(
                "Cache(dir='') would write the cache into the working directory; name a "
                "directory for it, e.g. Cache('compile-cache')"
            )
        if not isinstance(self.extra, str):
            raise ShapeBucketError(f"Cache(extra) must be a str, got {self.extra!r}")
        if self.timeout is not None:
            check_number("Cache(timeout)", self.timeout, above=0, hint=_TIMEOUT_HINT)

    def key(self, job: Job) -> str:
        """The cache key of ``job`` (batches are made one at a time, only to describe them)."""
        others = sorted(repr(m) for m in job.modes if not isinstance(m, Cache))
        described = {f"{s.rows}x{s.length}": describe_batch(job.batch(s)) for s in job.plan}
        return job_key(job.model, job.step, described, self.extra + "".join(others), described=True)

    def _check_dir(self) -> None:
        """The cache directory must be one prewarm can write, checked before compiling
        anything (a save after every shape compiled would fail at the end)."""
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
        if not os.access(where, os.W_OK | os.X_OK):
            raise ShapeBucketError(
                f"Cache(dir={str(self.dir)!r}): {where} is not writable, so the compiled code "
                "could not be saved; pass a directory this process can write"
            )

    def extra_files(self, job: Job) -> dict[str, bytes]:
        """Files to save with the cache beside what the compiler built (``AotCache``'s)."""
        return {}

    def setup(self, job: Job) -> None:
        self._check_dir()
        path = Path(self.dir) / self.key(job)
        job.memo["cache_path"] = path
        job.memo["cache_counts"] = compat.inductor_cache_counts()
        job.report.cache_path = str(path)
        # one builder per cache: other processes wait here, then load what it saved (the
        # lock goes when the job does, also after an error; see compile.lock)
        lock = contextlib.ExitStack()
        job.memo["cache_lock"] = lock
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
            if new or extra:
                save_held_compile_cache(job.memo["cache_path"], extra)
                job.report.cache_saved = True
        finally:
            job.memo["cache_lock"].close()

"""``prewarm``: compile every bucket before training, then put everything back as it was.

Its batches come from the collator (:meth:`BucketCollator.repad`), the one owner
of padding, so what is prewarmed has exactly the shapes, dtypes and strides of
the batches the training loop will see.

Typical use::

    model = torch.compile(model, dynamic=False)
    report = shapebucket.prewarm(model, buckets, example=next(iter(loader)), collator=collate)
    with shapebucket.no_recompiles(buckets):
        for batch in loader:
            train_step(batch)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import _torch_compat as compat
from .._progress import progress as progress_bar
from .._validate import check_int
from ..collate.bucket import BucketCollator, check_batch_sizes
from ..collate.packed import PackedCollator
from ..errors import ShapeBucketError
from ..plan.buckets import Buckets, as_buckets
from .cache import job_key, load_compile_cache, save_compile_cache
from .recompiles import LIMIT_HITS, CompileCounter, no_recompiles
from .state import Snapshot, restore, snapshot

__all__ = ["PrewarmReport", "prewarm"]


@dataclass
class PrewarmReport:
    """What :func:`prewarm` compiled: per bucket seconds and graphs, and the totals.

    >>> report = prewarm(lambda x: x.sum(), [4, 8], make_batch=lambda n: torch.ones(2, n), progress=False)
    >>> list(report.seconds), report.total_graphs  # an uncompiled function: nothing to compile
    ([4, 8], 0)
    """

    buckets: Buckets
    seconds: dict[int, float] = field(default_factory=dict)
    graphs: dict[int, int] = field(default_factory=dict)
    total_seconds: float = 0.0
    verify_seconds: float = 0.0
    memory_mb: dict[int, float] = field(default_factory=dict)
    limit: int = 0
    limit_raised_from: int | None = None
    optimizers_found: int = 0
    how: dict[int, str] = field(default_factory=dict)
    cache_path: str | None = None
    cache_loaded: bool = False
    cache_saved: bool = False

    @property
    def total_graphs(self) -> int:
        return sum(self.graphs.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": list(self.buckets),
            "seconds": {str(b): s for b, s in self.seconds.items()},
            "graphs": {str(b): g for b, g in self.graphs.items()},
            "total_seconds": self.total_seconds,
            "verify_seconds": self.verify_seconds,
            "memory_mb": {str(b): m for b, m in self.memory_mb.items()},
            "total_graphs": self.total_graphs,
            "limit": self.limit,
            "limit_raised_from": self.limit_raised_from,
            "optimizers_found": self.optimizers_found,
            "how": {str(b): h for b, h in self.how.items()},
            "cache_path": self.cache_path,
            "cache_loaded": self.cache_loaded,
            "cache_saved": self.cache_saved,
        }

    def __str__(self) -> str:
        lines = [f"{'bucket':>8s} {'seconds':>8s} {'graphs':>6s}  how"]
        lines += [
            f"{b:>8d} {self.seconds[b]:>8.2f} {self.graphs[b]:>6d}  {self.how.get(b, '')}"
            for b in self.seconds
        ]
        lines.append(f"{'total':>8s} {self.total_seconds:>8.2f} {self.total_graphs:>6d}")
        if self.total_graphs == 0:
            lines.append(
                "nothing was compiled: the model is not torch.compile'd, or it was compiled "
                "for every bucket before this call"
            )
        elif self.verify_seconds:
            lines.append(
                f"verified: every bucket ran again with no recompile ({self.verify_seconds:.2f} s)"
            )
        if self.optimizers_found:
            lines.append(
                f"restored {self.optimizers_found} optimizer(s) the step used but prewarm was not given"
            )
        if self.cache_path is not None:
            got = "loaded" if self.cache_loaded else "nothing usable there"
            lines.append(
                f"compile cache {self.cache_path}: {got}"
                + ("; saved after prewarm" if self.cache_saved else "")
            )
        if self.limit_raised_from is not None:
            lines.append(
                f"recompile limit raised from {self.limit_raised_from} to {self.limit} for {len(self.buckets)} buckets"
            )
        return "\n".join(lines)


def _run(model: Any, step: Callable[[Any], Any] | None, batch: Any) -> None:
    if step is not None:
        step(batch)
        return
    if model is None:
        raise ShapeBucketError("prewarm needs a model or a step function")
    if isinstance(batch, Mapping):
        out = model(**batch)
    elif isinstance(batch, (list, tuple)):
        out = model(*batch)
    else:
        out = model(batch)
    loss = out
    if isinstance(out, Mapping) and "loss" in out:
        loss = out["loss"]
    elif hasattr(out, "loss"):
        loss = out.loss
    if isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.requires_grad:
        loss.backward()


def _mark_specialized(batch: Any, bucket: int, buckets: list[int], dim: int) -> None:
    """Mark the length dim of every tensor of ``batch`` that has it: the first with one
    specialisation per bucket, the others plainly (they share its size symbol; torch
    builds no cross product of specialisations)."""
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        values = [batch]
    tensors = [
        v for v in values if isinstance(v, torch.Tensor) and v.ndim > dim and v.shape[dim] == bucket
    ]
    if not tensors:
        raise ShapeBucketError(
            f"prewarm(specialize=True): no tensor of the batch for bucket {bucket} has that length "
            f"in dim {dim}; pass the collator that made the example (its seq_dim says which dim)"
        )
    compat.mark_dynamic_specialized(tensors[0], dim, buckets)
    for t in tensors[1:]:
        compat.mark_dynamic_dim(t, dim, strict=True, min=None, max=None)


def prewarm(
    model: Any,
    buckets: Buckets | Sequence[int],
    *,
    example: Any = None,
    make_batch: Callable[[int], Any] | None = None,
    step: Callable[[Any], Any] | None = None,
    rows: int | Mapping[int, int] | None = None,
    collator: BucketCollator | PackedCollator | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    raise_limit: bool = True,
    verify: bool = True,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    cache_extra: str = "",
    specialize: bool = False,
    row_buckets: Sequence[int] | None = None,
    inference: bool = False,
    repeat: int = 1,
) -> PrewarmReport:
    """Compile every bucket before training, then put the model back exactly as it was.

    For each bucket a batch is built from ``example`` (a real batch made by
    ``collator``) with ``collator.repad(example, bucket, rows)``, or by
    ``make_batch(bucket)``. ``rows`` is ``rows`` (an int or a mapping
    ``bucket -> rows``, such as ``sampler.rows``), else the collator's
    own ``rows``, else the example's row count. Without ``collator`` a
    default ``BucketCollator(buckets)`` re-pads the example; pass the collator
    that made it whenever it has other settings (``seq_dim``, padding side,
    pad values, ``sequence_keys``). Then ``step(batch)`` runs (a whole training
    step), or else ``model(**batch)`` / ``model(*batch)`` followed by
    ``backward()`` when the output (or its ``.loss``) is a scalar that requires
    grad, so forward and backward compile.

    Afterwards parameters, buffers, ``.grad``s, the state of ``optimizer``,
    train/eval flags and the torch, numpy and Python RNG states are restored
    bitwise, in place (:mod:`shapebucket.compile.state`). An optimizer that ``step``
    uses but was not passed is found when it first steps (a global optimizer
    pre-hook, removed afterwards) and restored too (``report.optimizers_found``
    counts them); an LR scheduler stepped inside ``step`` is not, so step
    schedulers outside the function prewarm runs. With
    ``verify=True`` every bucket is then run once more from that restored state
    under :func:`no_recompiles`, and restored again, which proves the training
    loop will not recompile.

    A function that hits the recompile limit during prewarm would run eagerly
    for some buckets, so that raises :class:`ShapeBucketError`; compiling 0
    graphs gives a warning (the model is not compiled, or was compiled before).

    With ``cache_dir`` the compiled code is kept between runs: prewarm loads
    ``cache_dir/<key>`` before compiling and saves it afterwards, the key
    hashing what invalidates it (torch version, devices, the source of the
    model's module classes and of ``step``, every prewarmed batch's shapes,
    dtypes and strides, and ``cache_extra``: put the compile options there).
    A damaged or foreign cache is refused with a warning
    (:func:`~shapebucket.load_compile_cache`). ``report.how`` says per bucket
    whether its graphs were ``"compiled"``, loaded from the ``"cache"``, or
    ``"none"`` (nothing new to compile).

    With ``specialize=True`` the model is compiled once for all buckets: every
    prewarm batch's length dimension (dim ``seq_dim + 1`` of the collator, 1
    without one) is marked dynamic with ``specialize_on`` one predicate per
    bucket, so torch traces one dynamic graph and compiles a kernel specialised
    to each bucket, and keeps the generic one for any other length: a length
    no bucket covers runs compiled code instead of recompiling. The training
    loop needs no marks (its batches match the dynamic graph's guards); the
    model must be compiled with ``dynamic=False`` or ``None`` (``report.how``
    says ``"specialised"``).

    For inference, ``row_buckets`` (the row counts a request batch is padded
    to, as ``BucketCollator(row_buckets=...)`` pads them) prewarms every
    bucket at every one of those row counts (``report`` sums them per bucket),
    and ``inference=True`` runs forward only, under ``torch.inference_mode()``
    (no backward, no optimizer): serve under ``torch.inference_mode()`` too, as
    the compiled graphs guard on it, with batches made outside it (as a
    DataLoader makes them; a tensor created inside inference mode is guarded
    as a different kind of input).

    ``repeat`` runs each prewarm batch that many times. A model compiled with
    ``mode="reduce-overhead"`` records a CUDA graph per shape only after warm-up
    runs (cudagraph trees: a warm-up run, then the recording), so pass
    ``repeat=3`` for it; on CUDA ``report.memory_mb`` gives the device memory
    each bucket kept (its CUDA graph's pool included).

    When there are more buckets than the recompile limit, the limit is raised
    globally (torch sets a per-function limit only at ``torch.compile`` time) and
    the report says so; ``raise_limit=False`` raises :class:`ShapeBucketError`
    instead.

    >>> model = torch.compile(torch.nn.Linear(4, 2), dynamic=False, backend="eager")
    >>> report = prewarm(model, [8, 16], make_batch=lambda n: torch.ones(n, 4), progress=False)
    >>> report.total_graphs, list(report.graphs)
    (2, [8, 16])
    """
    buckets = as_buckets(buckets)
    if (example is None) == (make_batch is None):
        raise ShapeBucketError(
            "pass exactly one of example (a collated batch) and make_batch(bucket_len)"
        )
    if collator is not None and not isinstance(collator, (BucketCollator, PackedCollator)):
        raise ShapeBucketError(
            "collator must be the BucketCollator (or PackedCollator) that made the example, "
            f"got {type(collator).__name__}"
        )
    rows_for = check_batch_sizes(rows, buckets)
    padder = None
    if example is not None:
        padder = collator if collator is not None else BucketCollator(buckets)
    if specialize and not compat.supports_specialize_on():
        raise ShapeBucketError(
            f"prewarm(specialize=True) needs mark_dynamic(specialize_on=...), which torch "
            f"{torch.__version__} does not have; upgrade torch or prewarm static graphs"
        )
    length_dim = 1 + (padder.seq_dim if padder is not None else 0)
    repeat = check_int("repeat", repeat, minimum=1)
    sizes: list[int | None] = [None]
    if row_buckets is not None:
        if isinstance(row_buckets, (str, bytes)) or not isinstance(row_buckets, Sequence):
            raise ShapeBucketError(f"row_buckets must be a list of ints >= 1, got {row_buckets!r}")
        if example is None:
            raise ShapeBucketError("row_buckets needs example= (and its collator) to re-pad")
        checked = {check_int(f"row_buckets[{i}]", r, minimum=1) for i, r in enumerate(row_buckets)}
        sizes = list(sorted(checked))
    shapes = len(buckets) * len(sizes)
    report = PrewarmReport(buckets=buckets)
    limit = compat.get_recompile_limit()
    if shapes > limit:
        if not raise_limit:
            if row_buckets is None:
                buckets.check_limit(limit)
            raise ShapeBucketError(
                f"{len(buckets)} buckets x {len(sizes)} batch sizes = {shapes} graphs > recompile "
                f"limit {limit}; pass raise_limit=True or torch.compile(..., recompile_limit={shapes})"
            )
        report.limit_raised_from = compat.set_recompile_limit(shapes)
        limit = shapes
    report.limit = limit

    def batch_for(b: int, size: int | None = None) -> Any:
        if padder is None:
            return make_batch(b)  # type: ignore[misc]  # one of the two is set (checked above)
        rows = rows_for if not isinstance(rows_for, dict) else rows_for[b]
        return padder.repad(example, b, size if size is not None else rows)

    def prewarm_batch(b: int, size: int | None) -> Any:
        batch = batches.pop((b, size)) if (b, size) in batches else batch_for(b, size)
        if specialize:
            _mark_specialized(batch, b, list(buckets), length_dim)
        return batch

    def run(batch: Any) -> None:
        if inference:
            with torch.inference_mode():
                _run(model, step, batch)
        else:
            _run(model, step, batch)

    # Optimizers the step uses but the caller did not pass: a global pre-hook sees
    # each one before its first step here, and its state is copied then and put back.
    others: dict[int, Snapshot] = {}

    def catch_optimizer(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if opt is not optimizer and id(opt) not in others:
            others[id(opt)] = snapshot(None, opt)

    def put_back() -> None:
        for other in others.values():
            restore(other)
        restore(snap)  # last: its RNG states and parameters are the ones from before prewarm

    # the cache key needs every batch's shapes up front; without a cache each batch is
    # made when its bucket runs, so only one is alive at a time
    batches = (
        {(b, r): batch_for(b, r) for b in buckets for r in sizes} if cache_dir is not None else {}
    )
    cache = None
    if cache_dir is not None:
        named = {b if r is None else f"{b}x{r}": batch for (b, r), batch in batches.items()}
        cache = Path(cache_dir) / job_key(model, step, named, cache_extra)  # type: ignore[arg-type]
        report.cache_path = str(cache)
        report.cache_loaded = load_compile_cache(cache)

    misses_before = compat.inductor_cache_counts()[1]
    snap = snapshot(model, optimizer)
    hook = register_optimizer_step_pre_hook(catch_optimizer)
    hits_before = len(LIMIT_HITS)
    start = time.perf_counter()
    try:
        try:
            bar = progress_bar(list(buckets), desc="prewarm", unit="bucket", enabled=progress)
            for b in bar:
                done = sum(report.seconds.values())
                bar.set_postfix_str(f"bucket {b}, {done:.0f} s so far")
                t0 = time.perf_counter()
                hits0, misses0 = compat.inductor_cache_counts()
                on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
                mem0 = torch.cuda.memory_allocated() if on_cuda else 0
                with CompileCounter() as cc:
                    for size in sizes:
                        batch = prewarm_batch(b, size)
                        for _ in range(repeat):
                            run(batch)
                if on_cuda:
                    torch.cuda.synchronize()
                    report.memory_mb[b] = (torch.cuda.memory_allocated() - mem0) / 2**20
                hits, misses = compat.inductor_cache_counts()
                report.seconds[b] = time.perf_counter() - t0
                report.graphs[b] = cc.graphs
                report.how[b] = (
                    "specialised"
                    if specialize
                    else "none"
                    if cc.graphs == 0
                    else "cache"
                    if hits > hits0 and misses == misses0
                    else "compiled"
                )
            report.total_seconds = time.perf_counter() - start
        finally:
            put_back()
        if len(LIMIT_HITS) > hits_before:
            raise ShapeBucketError(
                f"prewarm: a compiled function hit the recompile limit ({report.limit}), so it runs "
                "eagerly for some buckets: it compiled more than one graph per bucket, or it was "
                "compiled for other shapes before. Compile it with torch.compile(..., "
                f"recompile_limit=N) for N >= the graphs it needs, or fewer buckets.\n"
                f"compiler said: {LIMIT_HITS[-1]}"
            )
        if verify:
            t0 = time.perf_counter()
            try:
                with no_recompiles(buckets):
                    for b in buckets:
                        for size in sizes:
                            run(batch_for(b, size))
            finally:
                put_back()
            report.verify_seconds = time.perf_counter() - t0
    finally:
        hook.remove()
    if cache is not None and compat.inductor_cache_counts()[1] > misses_before:
        save_compile_cache(cache)  # inductor compiled something new: keep it
        report.cache_saved = True
    report.optimizers_found = len(others)
    if report.total_graphs == 0:
        warnings.warn(
            "prewarm compiled 0 graphs: the model is not torch.compile'd (pass the compiled "
            "model, or a step that calls it), torch.compile skipped it, or it was already "
            "compiled for every bucket before this call (then nothing is wrong)",
            stacklevel=2,
        )
    return report

"""Compile helpers: prewarm every bucket, count compiles, prove no recompile, keep the cache.

Every private torch API these use goes through ``shapebucket._torch_compat``.

Typical use::

    model = torch.compile(model, dynamic=False)
    report = shapebucket.prewarm(model, buckets, example=next(iter(loader)), collator=collate)
    with shapebucket.no_recompiles(buckets):
        for batch in loader:
            train_step(batch)
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import _torch_compat as compat
from .buckets import Buckets, as_buckets
from .errors import ShapeBucketError

__all__ = [
    "CompileCounter",
    "PrewarmReport",
    "count_compiles",
    "load_compile_cache",
    "mark_dynamic",
    "no_recompiles",
    "prewarm",
    "save_compile_cache",
]

_warned_keys: set[str] = set()


# -- mark_dynamic ---------------------------------------------------------------------


def _walk(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, obj


def mark_dynamic(
    batch: Any,
    dim: int = 1,
    *,
    keys: Sequence[str] | None = None,
    min: int | None = None,
    max: int | None = None,
    strict: bool = False,
) -> list[str]:
    """Mark dim ``dim`` of every tensor in a (nested) batch as dynamic; returns the marked paths.

    Non-tensors and tensors with no dim ``dim`` are skipped; ``keys`` limits the
    marking to those top-level keys (or paths such as ``"0"``, ``"[1]"``).

    * ``strict=False`` (default) uses ``maybe_mark_dynamic``: if the model
      specialises the dim (a graph break on the length, a Python ``if`` on it),
      compilation still succeeds, but with a static graph per length, which
      brings back the recompiles. A one-time warning per key says so.
    * ``strict=True`` uses ``mark_dynamic``: the compiler raises
      ``ConstraintViolationError`` when the model specialises the dim, and
      ``min``/``max`` become the compiler's value range for it (``maybe_mark_dynamic``
      takes no range, so ``min``/``max`` need ``strict=True``).

    Sizes 0 and 1 are always specialised by the compiler, so a dynamic range
    must start at 2 or above: ``min`` < 2 raises.

    Marks live on the tensor objects: apply them after the batch is moved to
    its device (``.to()`` returns new tensors without the marks).

    >>> batch = {"input_ids": torch.zeros(2, 5, dtype=torch.long), "id": 3, "pair": (torch.zeros(2, 5), torch.zeros(2))}
    >>> mark_dynamic(batch, strict=True)
    ['input_ids', 'pair[0]']
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
        raise ShapeBucketError(f"dim must be an int >= 0, got {dim!r}")
    if (min is not None or max is not None) and not strict:
        raise ShapeBucketError(
            f"min={min}, max={max} need strict=True: maybe_mark_dynamic (strict=False) takes no range"
        )
    if min is not None and min < 2:
        raise ShapeBucketError(
            f"min must be >= 2, got {min}: the compiler always specialises sizes 0 and 1, so they are "
            "never part of a dynamic range; use min=2"
        )
    if min is not None and max is not None and max < min:
        raise ShapeBucketError(f"max ({max}) must be >= min ({min})")
    wanted = None if keys is None else {str(k) for k in keys}
    marked = []
    for path, value in _walk(batch):
        if not isinstance(value, torch.Tensor) or value.ndim <= dim:
            continue
        path = path or "<tensor>"
        top = re.split(r"[.\[]", path, maxsplit=1)[0] or path
        if wanted is not None and path not in wanted and top not in wanted:
            continue
        size = value.shape[dim]
        if (min is not None and size < min) or (max is not None and size > max):
            raise ShapeBucketError(
                f"{path!r} has size {size} at dim {dim}, outside min={min}, max={max}"
            )
        compat.mark_dynamic_dim(value, dim, strict=strict, min=min, max=max)
        marked.append(path)
        if not strict and path not in _warned_keys:
            _warned_keys.add(path)
            warnings.warn(
                f"shapebucket.mark_dynamic: {path!r} dim {dim} is marked with maybe_mark_dynamic (strict=False). "
                "If the model specialises this dim, torch.compile quietly builds one static graph per length "
                "and falls back to eager after the recompile limit; pass strict=True to get an error instead.",
                stacklevel=2,
            )
    if wanted is not None:
        missing = wanted - set(marked) - {re.split(r"[.\[]", p, maxsplit=1)[0] for p in marked}
        if missing:
            raise ShapeBucketError(
                f"keys {sorted(missing)} name no tensor with a dim {dim} in the batch"
            )
    return marked


# -- counting compiles ----------------------------------------------------------------


class _ReasonHandler(logging.Handler):
    def __init__(self, sink: list[str], contains: str = "") -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink
        self.contains = contains

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.contains in message:
            self.sink.append(message)


class CompileCounter:
    """Count graphs compiled inside a ``with`` block and record every recompile's reason.

    Graphs are the delta of dynamo's ``unique_graphs`` counter (which
    ``torch._dynamo.reset()`` does not clear); reasons come from the
    ``recompiles`` log channel, switched on for the block and restored after.
    ``limit_hits`` collects dynamo's "hit config.recompile_limit" warnings: each
    is a function that from then on runs eagerly (or raises, under ``fullgraph``).

    >>> with CompileCounter() as cc:
    ...     pass
    >>> cc.graphs, cc.recompiles
    (0, [])
    """

    def __init__(self) -> None:
        self.recompiles: list[str] = []
        self.limit_hits: list[str] = []
        self._start: int | None = None
        self._end: int | None = None
        self._stack: contextlib.ExitStack | None = None

    @property
    def graphs(self) -> int:
        """Graphs compiled so far inside the block (final once the block exits)."""
        if self._start is None:
            return 0
        end = self._end if self._end is not None else compat.unique_graphs()
        return end - self._start

    def __enter__(self) -> CompileCounter:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(compat.add_recompile_handler(_ReasonHandler(self.recompiles)))
        self._stack.enter_context(
            compat.add_limit_handler(_ReasonHandler(self.limit_hits, "hit config."))
        )
        self._start, self._end = compat.unique_graphs(), None
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = compat.unique_graphs()
        if self._stack is not None:
            self._stack.close()

    def __str__(self) -> str:
        lines = [f"{self.graphs} graphs compiled, {len(self.recompiles)} recompiles"]
        if self.limit_hits:
            lines[0] += f", recompile limit hit {len(self.limit_hits)} times"
        lines += [f"  - {r.strip().splitlines()[-1].strip()}" for r in self.recompiles]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"CompileCounter(graphs={self.graphs}, recompiles={len(self.recompiles)})"


def count_compiles() -> CompileCounter:
    """A :class:`CompileCounter`, for ``with count_compiles() as cc: ...``.

    >>> f = torch.compile(lambda x: x * 2, dynamic=False)
    >>> with count_compiles() as cc:
    ...     _ = f(torch.ones(3))
    >>> cc.graphs
    1
    """
    return CompileCounter()


# -- no_recompiles --------------------------------------------------------------------

_MISMATCH = re.compile(
    r"tensor '([^']+)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)"
)


@contextlib.contextmanager
def no_recompiles(buckets: Buckets | Sequence[int] | None = None) -> Iterator[None]:
    """Fail on any recompile inside the block, with a :class:`ShapeBucketError`.

    Uses the compiler's ``fail_on_recompile`` stance (restored on exit, also on
    error). The error names the input size that was not prewarmed and, when
    ``buckets`` is given, the bucket table. Functions compiled for the first time
    inside the block still compile: only *re*compiles fail.

    >>> f = torch.compile(lambda x: x + 1, dynamic=False)
    >>> _ = f(torch.ones(2, 8))
    >>> with no_recompiles([8, 16]):
    ...     _ = f(torch.ones(2, 8))  # a compiled shape: fine
    >>> try:
    ...     with no_recompiles([8, 16]):
    ...         _ = f(torch.ones(2, 16))  # a new shape
    ... except ShapeBucketError as e:
    ...     print(str(e).splitlines()[0][:80])
    recompile inside no_recompiles(): input 'x' has size 16 at dim 1, a shape that w
    """
    table = None if buckets is None else as_buckets(buckets)
    try:
        with compat.stance("fail_on_recompile"):
            yield
    except RuntimeError as e:
        text = str(e)
        if "fail_on_recompile" not in text:
            raise
        failures = re.findall(r"- \d+/\d+: (.*)", text)
        sizes = [m for f in failures if (m := _MISMATCH.search(f))]
        others = [f for f in failures if not _MISMATCH.search(f)]
        if sizes and not others:
            name, dim, _, actual = sizes[0].groups()
            what = f"input {name!r} has size {actual} at dim {dim}, a shape that was not prewarmed"
        elif others:
            what = f"an input failed a guard other than its size ({others[0].strip()}), e.g. a different stride, dtype or device than the prewarmed batch"
        else:
            what = "an input or guard changed in a way that was not prewarmed"
        where = f"; buckets are {table!r}" if table is not None else ""
        raise ShapeBucketError(
            f"recompile inside no_recompiles(): {what}{where}. Pad every batch to a bucket "
            f"(BucketCollator) and prewarm every bucket (and batch size) first.\ncompiler said: {text}"
        ) from e


# -- prewarm ---------------------------------------------------------------------------


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
    limit: int = 0
    limit_raised_from: int | None = None

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
            "total_graphs": self.total_graphs,
            "limit": self.limit,
            "limit_raised_from": self.limit_raised_from,
        }

    def __str__(self) -> str:
        lines = [f"{'bucket':>8s} {'seconds':>8s} {'graphs':>6s}"]
        lines += [f"{b:>8d} {self.seconds[b]:>8.2f} {self.graphs[b]:>6d}" for b in self.seconds]
        lines.append(f"{'total':>8s} {self.total_seconds:>8.2f} {self.total_graphs:>6d}")
        if self.verify_seconds:
            lines.append(
                f"verified: every bucket ran again with no recompile ({self.verify_seconds:.2f} s)"
            )
        if self.limit_raised_from is not None:
            lines.append(
                f"recompile limit raised from {self.limit_raised_from} to {self.limit} for {len(self.buckets)} buckets"
            )
        return "\n".join(lines)


@dataclass
class _Snapshot:
    params: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    buffers: list[tuple[torch.Tensor, torch.Tensor]]
    optimizer: Any
    opt_state: dict[Any, dict[str, Any]] | None
    opt_groups: list[dict[str, Any]] | None
    rng: tuple[Any, ...]
    training: list[tuple[torch.nn.Module, bool]]


def _tensors_of(
    model: Any, optimizer: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.nn.Module]]:
    params: dict[int, torch.Tensor] = {}
    buffers: dict[int, torch.Tensor] = {}
    modules: list[torch.nn.Module] = []
    if isinstance(model, torch.nn.Module):
        modules = list(model.modules())
        params.update((id(p), p) for p in model.parameters())
        buffers.update((id(b), b) for b in model.buffers())
    if optimizer is not None:
        for group in optimizer.param_groups:
            params.update((id(p), p) for p in group["params"])
    return list(params.values()), list(buffers.values()), modules


def _snapshot(model: Any, optimizer: Any) -> _Snapshot:
    params, buffers, modules = _tensors_of(model, optimizer)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    rng = (
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if cuda else None,
        np.random.get_state(),
        random.getstate(),
    )
    opt_state = opt_groups = None
    if optimizer is not None:
        opt_state = {
            p: {
                k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                for k, v in s.items()
            }
            for p, s in optimizer.state.items()
        }
        opt_groups = [
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups
        ]
    return _Snapshot(
        params=[
            (p, p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
            for p in params
        ],
        buffers=[(b, b.detach().clone()) for b in buffers],
        optimizer=optimizer,
        opt_state=opt_state,
        opt_groups=opt_groups,
        rng=rng,
        training=[(m, m.training) for m in modules],
    )


@torch.no_grad()
def _restore(snap: _Snapshot) -> None:
    """Put everything back in place (same tensor objects, so compiled guards still hold)."""
    for p, value, grad in snap.params:
        p.copy_(value)
        if grad is None:
            p.grad = None
        elif p.grad is not None and p.grad.shape == grad.shape:
            p.grad.copy_(grad)
        else:
            p.grad = grad.clone()
    for b, value in snap.buffers:
        b.copy_(value)
    opt = snap.optimizer
    if opt is not None and snap.opt_state is not None and snap.opt_groups is not None:
        for p in list(opt.state.keys()):
            if p not in snap.opt_state:
                del opt.state[p]
        for p, saved in snap.opt_state.items():
            live = opt.state[p]
            for k in list(live.keys()):
                if k not in saved:
                    del live[k]
            for k, v in saved.items():
                cur = live.get(k)
                if (
                    isinstance(v, torch.Tensor)
                    and isinstance(cur, torch.Tensor)
                    and cur.shape == v.shape
                ):
                    cur.copy_(v)
                else:
                    live[k] = v.clone() if isinstance(v, torch.Tensor) else v
        for group, saved_group in zip(opt.param_groups, snap.opt_groups, strict=True):
            group.update(saved_group)
    cpu, cuda, np_state, py_state = snap.rng
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(np_state)
    random.setstate(py_state)
    for m, mode in snap.training:
        m.training = mode


def _default_pad(key: Any, t: torch.Tensor, collator: Any) -> Any:
    """The collator's pad value for ``key`` (a dict key, or a tuple position)."""
    masks = (
        getattr(collator, "mask_key", "attention_mask"),
        getattr(collator, "sample_mask_key", None),
    )
    if key in masks:
        return False if t.dtype == torch.bool else 0
    if collator is not None:
        return collator.pad_value(key)
    return -100 if key == "labels" else 0


def _resize(t: torch.Tensor, dim: int, size: int, pad: Any, left: bool) -> torch.Tensor:
    have = t.shape[dim]
    if have == size:
        return t
    if have > size:
        return t.narrow(dim, have - size, size) if left else t.narrow(dim, 0, size)
    shape = list(t.shape)
    shape[dim] = size - have
    filler = torch.full(shape, pad, dtype=t.dtype, device=t.device)
    return torch.cat([filler, t] if left else [t, filler], dim=dim)


def _batch_from_example(
    example: Any, bucket: int, rows: int | None, seq_keys: set[str] | None, collator: Any
) -> Any:
    tensors = [(p, v) for p, v in _walk(example) if isinstance(v, torch.Tensor)]
    seq_tensors = [v for p, v in tensors if v.ndim >= 2 and (seq_keys is None or p in seq_keys)]
    if not seq_tensors:
        raise ShapeBucketError(
            "example has no tensor with a sequence dim (dim 1); pass seq_keys or make_batch"
        )
    length = seq_tensors[0].shape[1]
    batch0 = seq_tensors[0].shape[0]
    left = getattr(collator, "padding_side", "right") == "left"

    def convert(path: str, key: Any, value: Any) -> Any:
        if isinstance(value, Mapping):
            return type(value)(
                {k: convert(f"{path}.{k}" if path else str(k), k, v) for k, v in value.items()}
            )  # type: ignore[call-arg]
        if isinstance(value, (list, tuple)):
            items = [convert(f"{path}[{i}]", i, v) for i, v in enumerate(value)]
            return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
        if not isinstance(value, torch.Tensor):
            return value
        is_seq = (
            value.ndim >= 2 and value.shape[1] == length and (seq_keys is None or path in seq_keys)
        )
        if is_seq:
            value = _resize(value, 1, bucket, _default_pad(key, value, collator), left)
        if rows is not None and value.ndim >= 1 and value.shape[0] == batch0 and rows != batch0:
            index = torch.arange(rows, device=value.device) % batch0
            value = value.index_select(0, index)
        # collated batches are contiguous; dynamo guards on strides, so a cropped
        # view would compile a graph no real batch can use
        return value.contiguous()

    return convert("", None, example)


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


def _progress(items: list[int], enabled: bool) -> Any:
    if not enabled:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional (the bench extra)
        return _PlainProgress(items)
    return tqdm(items, desc="prewarm", unit="bucket", file=sys.stderr)


class _PlainProgress:
    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[int]:
        for i, b in enumerate(self.items, 1):
            print(f"prewarm: bucket {b} ({i}/{len(self.items)})", file=sys.stderr, flush=True)
            yield b

    def set_postfix_str(self, text: str) -> None:
        pass


def prewarm(
    model: Any,
    buckets: Buckets | Sequence[int],
    *,
    example: Any = None,
    make_batch: Callable[[int], Any] | None = None,
    step: Callable[[Any], Any] | None = None,
    batch_size: int | Mapping[int, int] | None = None,
    seq_keys: Sequence[str] | None = None,
    collator: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    raise_limit: bool = True,
    verify: bool = True,
    progress: bool = True,
) -> PrewarmReport:
    """Compile every bucket before training, then put the model back exactly as it was.

    For each bucket a batch at that length is built from ``example`` (a real
    collated batch: sequence tensors, those whose dim 1 has the example's
    length, are cropped or padded with the collator's pad values; with
    ``batch_size`` rows are repeated or cropped) or by ``make_batch(bucket)``.
    Then ``step(batch)`` runs (a whole training step), or else ``model(**batch)``
    / ``model(*batch)`` followed by ``backward()`` when the output (or its
    ``.loss``) is a scalar that requires grad, so forward and backward compile.

    Afterwards parameters, buffers, ``.grad``s, the state of ``optimizer`` (pass
    the one ``step`` uses), train/eval flags and the torch, numpy and Python RNG
    states are restored bitwise, in place. With ``verify=True`` every bucket is
    then run once more from that restored state under :func:`no_recompiles`, and
    restored again, which proves the training loop will not recompile.

    When there are more buckets than the recompile limit, the limit is raised
    globally (torch sets a per-function limit only at ``torch.compile`` time) and
    the report says so; ``raise_limit=False`` raises :class:`ShapeBucketError`
    instead.

    >>> model = torch.compile(torch.nn.Linear(4, 2), dynamic=False)
    >>> report = prewarm(model, [8, 16], make_batch=lambda n: torch.ones(n, 4), progress=False)
    >>> report.total_graphs, list(report.graphs)
    (2, [8, 16])
    """
    buckets = as_buckets(buckets)
    if (example is None) == (make_batch is None):
        raise ShapeBucketError(
            "pass exactly one of example (a collated batch) and make_batch(bucket_len)"
        )
    if isinstance(batch_size, Mapping):
        missing = [b for b in buckets if b not in batch_size]
        if missing:
            raise ShapeBucketError(f"batch_size has no entry for buckets {missing}")
    elif batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ShapeBucketError(
            f"batch_size must be an int >= 1 or a mapping bucket -> rows, got {batch_size!r}"
        )
    report = PrewarmReport(buckets=buckets)
    limit = compat.get_recompile_limit()
    if len(buckets) > limit:
        if not raise_limit:
            buckets.check_limit(limit)
        report.limit_raised_from = compat.set_recompile_limit(len(buckets))
        limit = len(buckets)
    report.limit = limit
    keys = None if seq_keys is None else set(seq_keys)

    def batch_for(b: int) -> Any:
        if make_batch is not None:
            return make_batch(b)
        rows = batch_size.get(b) if isinstance(batch_size, Mapping) else batch_size
        return _batch_from_example(example, b, rows, keys, collator)

    snap = _snapshot(model, optimizer)
    start = time.perf_counter()
    try:
        bar = _progress(list(buckets), progress)
        for b in bar:
            if hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(f"bucket {b}")
            t0 = time.perf_counter()
            with CompileCounter() as cc:
                _run(model, step, batch_for(b))
            report.seconds[b] = time.perf_counter() - t0
            report.graphs[b] = cc.graphs
        report.total_seconds = time.perf_counter() - start
    finally:
        _restore(snap)
    if verify:
        t0 = time.perf_counter()
        try:
            with no_recompiles(buckets):
                for b in buckets:
                    _run(model, step, batch_for(b))
        finally:
            _restore(snap)
        report.verify_seconds = time.perf_counter() - t0
    return report


# -- compile cache -------------------------------------------------------------------------


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

    >>> import tempfile
    >>> sizes = save_compile_cache(tempfile.mkdtemp())
    >>> sorted(sizes)
    ['artifacts_bytes', 'inductor_bytes']
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
    >>> load_compile_cache(tempfile.mkdtemp())  # an empty directory holds no cache
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

"""``calibrate_rows``: the largest rows per length whose whole training step fits a
memory budget, measured on the job's device by a search (:func:`largest_fitting`),
longest length first, every step's changes put back (:mod:`shapebucket.compile.state`).
What it measures, what it puts back and how it searches: ``docs/calibrate.md``.
"""

from __future__ import annotations

import functools
import numbers
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._validate import check_int, check_number
from ..compile.calls import check_callables, run_batch
from ..compile.recompiles import CompileCounter
from ..compile.state import Snapshot, optimizers_stepped, restore_objects, snapshot
from ..compile.state import restore as restore_state
from ..errors import ShapeBucketError
from ..plan.contract import check_batch_shape
from ..plan.shapes import Shape, ShapePlan
from .memory import collect, device_memory, steady_peak_bytes, tensors_of
from .report import Probe, RowsReport, size

__all__ = ["calibrate_rows", "largest_fitting"]

EAGER_WHY = (
    "eager steps keep every intermediate that autograd saves; a compiled step of the same "
    "shape saves a subset (inductor's partitioner recomputes cheap ones and fuses the rest), "
    "so it peaks at or below the eager one in the usual case, and the margin covers the "
    "allocator's differences; measuring eagerly compiles no graph for the probed shapes"
)
COMPILED_WHY = (
    "the steps ran the compiled model itself, so the peak is the compiled step's; each probed "
    "shape compiled its own graph ({graphs} in all), which training reuses only at the "
    "chosen rows"
)


def _budget_bytes(budget: Any, device: torch.device) -> int:
    if isinstance(budget, numbers.Integral) and not isinstance(budget, bool):
        return check_int("budget", budget, minimum=1)
    fraction = check_number(
        "budget",
        budget,
        above=0,
        at_most=1,
        hint="; budget is bytes (an int) or, as a float, a fraction of the device's memory",
    )
    return int(fraction * device_memory(device))


def _lengths(lengths: Any) -> list[int]:
    if isinstance(lengths, ShapePlan):
        lengths = list(lengths.lengths)
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise ShapeBucketError(f"lengths must be ints >= 1 or a ShapePlan, got {lengths!r}")
    out = sorted({check_int("length", L, minimum=1) for L in lengths}, reverse=True)
    if not out:
        raise ShapeBucketError("lengths is empty: pass the plan's lengths (plan.lengths)")
    return out


def _device_of(batch: Any) -> torch.device:
    for tensor in tensors_of(batch):  # a tokenizer's BatchEncoding too: a Mapping
        return tensor.device
    raise ShapeBucketError(
        f"make_batch returned a {type(batch).__name__} with no tensor in it; return a tensor, "
        "or a dict (any mapping), list or tuple of tensors, on the device the job trains on"
    )


def largest_fitting(fits: Callable[[int], bool], start: int, max_rows: int) -> int:
    """The largest ``rows`` in ``[1, max_rows]`` with ``fits(rows)`` (0 if 1 does not fit),
    for a ``fits`` that is true up to some row count and false above it: measure
    ``start``, step away from it by 1, 2, 4, ... rows (up while it fits, down while it
    does not) until the answer is bracketed, then bisect the bracket. With the answer
    ``k`` rows from ``start``, about ``2 * log2(k)`` calls of ``fits`` (one measured
    step each): a good ``start`` saves most of them.

    >>> calls = []
    >>> largest_fitting(lambda r: calls.append(r) or r <= 37, 1, 1024), calls
    (37, [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37])
    >>> calls = []
    >>> largest_fitting(lambda r: calls.append(r) or r <= 37, 40, 1024), calls
    (37, [40, 39, 37, 38])
    """
    start = min(max(start, 1), max_rows)
    jump = 1
    if fits(start):
        lo, hi = start, None
        while hi is None and lo < max_rows:
            nxt = min(lo + jump, max_rows)
            lo, hi = (nxt, None) if fits(nxt) else (lo, nxt)
            jump *= 2
    else:
        lo, hi = 0, start
        while lo == 0 and hi > 1:
            nxt = max(hi - jump, 1)
            lo, hi = (nxt, hi) if fits(nxt) else (0, nxt)
            jump *= 2
    while hi is not None and hi - lo > 1 and lo > 0:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@dataclass
class _Search:
    """What every measured step of one calibration shares."""

    model: Any
    step: Callable[[Any], Any] | None
    make_batch: Callable[[Shape], Any]
    restore: list[Any]
    snap: Snapshot
    found: dict[torch.optim.Optimizer, Snapshot]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    budget: int = 0
    margin: float = 0.0
    probes: dict[int, list[Probe]] = field(default_factory=dict)

    @property
    def limit(self) -> int:
        return int(self.budget * (1 - self.margin))

    def put_back(self) -> None:
        """The optimizers found stepping first, then the snapshot taken before any step."""
        for other in self.found.values():
            restore_state(other)
        restore_state(self.snap)

    def find_device(self, length: int) -> None:
        """The device, from a first batch of one row at ``length``; whatever ``make_batch``
        drew is put back."""
        try:
            first = self.make_batch(Shape(1, length))
            self.device = _device_of(check_batch_shape(first, Shape(1, length)))
        finally:
            first = None
            self.put_back()

    def peak(self, length: int, rows: int) -> int | None:
        """One step's peak in bytes (``None``: out of memory), everything put back after."""
        collect(self.device)
        try:
            batch = check_batch_shape(self.make_batch(Shape(rows, length)), Shape(rows, length))

            def run() -> None:
                run_batch(self.model, self.step, batch, "calibrate_rows")

            objects = (self.model, *self.restore, *self.found, batch)
            return steady_peak_bytes(run, *objects, device=self.device)
        except torch.OutOfMemoryError:
            return None
        finally:
            batch = None
            self.put_back()

    def measure(self, length: int, rows: int) -> bool:
        """Whether ``rows`` rows at ``length`` fit. A step in which an optimizer not in
        ``restore`` stepped for the first time copied its state inside the measured step
        (:func:`~shapebucket.compile.state.optimizers_stepped`), so it is measured again."""
        known = -1
        while known != len(self.found):
            known = len(self.found)
            peak = self.peak(length, rows)
        self.probes[length].append(Probe(rows, peak, peak is not None and peak <= self.limit))
        return self.probes[length][-1].fits

    def search(self, order: list[int], max_rows: int) -> None:
        """Each length, longest first, from as many tokens as the last one got."""
        tokens = 0  # of the last length's rows: the next (shorter) length starts at as many
        for L in order:
            self.probes[L] = []
            largest_fitting(functools.partial(self.measure, L), max(1, tokens // L), max_rows)
            fitted = [p.rows for p in self.probes[L] if p.fits]
            if not fitted:
                one = next(p for p in self.probes[L] if p.rows == 1)
                said = "ran out of memory" if one.peak is None else f"peaks at {size(one.peak)}"
                raise ShapeBucketError(
                    f"length {L}: one row {said}, over the budget of {size(self.budget)} less "
                    f"the {self.margin:.0%} margin ({size(self.limit)}); raise the budget or "
                    f"lower the margin, or leave length {L} out (a smaller largest bucket, "
                    "truncating its samples)"
                )
            tokens = max(fitted) * L

    def report(self, seconds: float, graphs: int) -> RowsReport:
        rows, peak, over = {}, {}, {}
        for L in sorted(self.probes):
            best = max((p for p in self.probes[L] if p.fits), key=lambda p: p.rows)
            rows[L], peak[L] = best.rows, int(best.peak or 0)
            above = [p.rows for p in self.probes[L] if not p.fits and p.rows > best.rows]
            over[L] = min(above) if above else None
        return RowsReport(
            rows=rows,
            peak=peak,
            over=over,
            probes={L: tuple(self.probes[L]) for L in sorted(self.probes)},
            budget=self.budget,
            margin=self.margin,
            limit=self.limit,
            seconds=seconds,
            measured="compiled" if graphs else "eager",
            why=COMPILED_WHY.format(graphs=graphs) if graphs else EAGER_WHY,
            device=str(self.device),
        )


def calibrate_rows(
    model: Any,
    lengths: Iterable[int] | ShapePlan,
    budget: int | float,
    make_batch: Callable[[Shape], Any],
    *,
    step: Callable[[Any], Any] | None = None,
    restore: Iterable[Any] = (),
    margin: float = 0.1,
    max_rows: int = 1024,
) -> RowsReport:
    """For each length, the largest rows whose whole step peaks within the budget.

    ``make_batch(Shape(rows, length))`` makes a batch on the job's device;
    ``step(batch)`` runs one whole training step (forward, backward, the
    optimizer), or without ``step`` ``model(**batch)`` and ``backward()`` as in
    :func:`~shapebucket.prewarm`. ``budget`` is bytes (an int) or a fraction of
    the device's memory (a float in (0, 1]); a step fits when its peak (see
    :mod:`shapebucket.calibrate.memory`) is at most ``budget * (1 - margin)``.
    The model and everything in ``restore`` (optimizers, a ``GradScaler``, an
    EMA model; one object or a list) are put back bitwise after every step, and
    so is an optimizer that ``step`` steps without being passed (found as
    :func:`~shapebucket.prewarm` finds it). A length whose single row does not
    fit raises :class:`ShapeBucketError`. Pass the eager model (see
    :class:`RowsReport` ``why``).

    >>> model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    >>> batch = lambda s: torch.randn(s.rows, s.length, 16)
    >>> report = calibrate_rows(model, [8], 2**14, batch, max_rows=32)
    >>> report.peak[8] <= report.limit < report.over_peak(8), report.over[8] - report.rows[8]
    (True, 1)
    """
    order = _lengths(lengths)
    max_rows = check_int("max_rows", max_rows, minimum=1)
    check_number(
        "margin", margin, at_least=0, below=1, hint="; margin is the fraction of budget kept free"
    )
    check_callables(model, step, "calibrate_rows")
    _check_make_batch(make_batch)
    objects = restore_objects(restore, "calibrate_rows")
    t0 = time.perf_counter()
    with optimizers_stepped(o for o in objects if isinstance(o, torch.optim.Optimizer)) as found:
        search = _Search(model, step, make_batch, objects, snapshot(model, *objects), found)
        search.find_device(order[-1])
        search.budget, search.margin = _budget_bytes(budget, search.device), float(margin)
        with CompileCounter() as cc:
            search.search(order, max_rows)
    collect(search.device)
    return search.report(time.perf_counter() - t0, cc.graphs)


def _check_make_batch(make_batch: Any) -> None:
    """Refuse a ``make_batch`` that is not a function, before anything runs."""
    if not callable(make_batch):
        raise ShapeBucketError(
            f"calibrate_rows: make_batch must be a function Shape -> batch, got "
            f"{make_batch!r:.80}; pass one that builds a batch of shape.rows x shape.length "
            "on the job's device, as the collator makes them"
        )

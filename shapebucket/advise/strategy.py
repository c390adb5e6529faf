"""The strategy chosen from the job (:func:`choose_strategy`, :class:`StrategyReport`): every
layout, shape set and mode estimated by the job-time model (:mod:`.jobtime`) from one timed
step (:class:`~.timing.StepTiming`); the shortest job wins. ``docs/fit.md`` explains it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._lengths import MAX_BUCKET, CheckedLengths
from .._validate import check_int
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets
from ..fit.optimal import DEFAULT_ALIGN
from ..fit.step_cost import StepCost, check_model_dim
from .jobtime import MODES, Rates, job_seconds, unit_cost
from .shapesets import ShapeSet, bucket_sets, default_tokens, packing_sets
from .timing import StepTiming

__all__ = ["StrategyEstimate", "StrategyReport", "choose_strategy"]

_RANK = {mode: i for i, mode in enumerate(MODES)}  # a tie goes to the simpler mode


@dataclass(frozen=True)
class StrategyEstimate:
    """One option's estimated job: its ``layout`` (``"buckets"`` or ``"packing"``),
    ``mode`` (``"eager"``, ``"compile-first"`` or ``"compile-while-training"``),
    ``buckets`` (bucket boundaries, or packed row lengths) and ``rows`` per batch,
    ``num_shapes`` and ``token_efficiency`` of one epoch's plan, and seconds:
    ``warmup_seconds`` (compile-first: before the first step; compile-while-training:
    until every shape is compiled, in the background), ``train_seconds`` (the
    steps) and ``job_seconds`` (first step to last, warm-up included)."""

    layout: str
    mode: str
    buckets: Buckets
    rows: dict[int, int]
    num_shapes: int
    token_efficiency: float
    warmup_seconds: float
    train_seconds: float
    job_seconds: float

    def describe(self) -> str:
        """``packing [32, 64] (2 shapes), compile-first``."""
        what = "buckets" if self.layout == "buckets" else "packed rows"
        return f"{what} {list(self.buckets)} ({self.num_shapes} shapes), {self.mode}"


@dataclass(frozen=True)
class StrategyReport:
    """The option with the shortest estimated job (``chosen``), the best option of
    every layout and mode (``options``, the table), ``reason`` (one sentence) and
    ``notes`` (what is estimated, and how). ``num_samples`` counts the lengths,
    ``job_samples`` the samples the job trains on; ``num_shapes`` and
    ``token_efficiency`` are the chosen option's.

    >>> timing = StepTiming(compile_seconds=20, eager_seconds=0.05, compiled_seconds=0.03, rows=48, length=32)
    >>> lengths = [5, 9, 12, 30, 7, 3] * 50
    >>> choose_strategy(lengths, timing, model_dim=128, job_samples=1_000).chosen.mode
    'eager'
    >>> choose_strategy(lengths, timing, model_dim=128, job_samples=10**8).chosen.mode
    'compile-while-training'
    """

    chosen: StrategyEstimate
    options: list[StrategyEstimate]
    reason: str
    notes: list[str]
    num_samples: int
    job_samples: int
    model_dim: int | StepCost
    timing: StepTiming
    tokens_per_batch: int = 0
    batch_size: int = 64
    estimates: list[StrategyEstimate] = field(default_factory=list, repr=False)

    @property
    def num_shapes(self) -> int:
        """The chosen option's shapes."""
        return self.chosen.num_shapes

    @property
    def token_efficiency(self) -> float:
        """The chosen option's real over computed tokens."""
        return self.chosen.token_efficiency

    def __str__(self) -> str:
        t, cost = self.timing, f"model_dim {self.model_dim}"
        if isinstance(self.model_dim, StepCost):
            cost = f"step cost measured at lengths {list(self.model_dim.seconds_per_token)}"
        lines = [
            f"strategy from the job: {self.job_samples:,} samples to train on ({self.num_samples:,} "
            f"lengths), {cost}; timed step {t.rows}x{t.length}: eager "
            f"{t.eager_seconds:.4g} s, compiled {t.compiled_seconds:.4g} s; "
            f"{t.compile_seconds:.4g} s to compile a shape",
            f"  {'layout':<8s} {'mode':<23s} {'shapes':>6s} {'tokens':>7s} {'warm-up s':>10s} "
            f"{'train s':>10s} {'job s':>10s}  buckets",
        ]
        for e in self.options:
            mark = "  <- chosen" if e is self.chosen else ""
            shown = list(e.buckets) if len(e.buckets) <= 8 else [*list(e.buckets)[:6], "..."]
            lines.append(
                f"  {e.layout:<8s} {e.mode:<23s} {e.num_shapes:>6d} {e.token_efficiency:>7.1%} "
                f"{_s(e.warmup_seconds):>10s} {_s(e.train_seconds):>10s} {_s(e.job_seconds):>10s}  "
                f"{shown}{mark}"
            )
        lines.append(f"recommended: {self.chosen.describe()}: {self.reason}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        def one(e: StrategyEstimate) -> dict[str, Any]:
            return {**asdict(e), "buckets": list(e.buckets)}

        return {
            "chosen": one(self.chosen),
            "options": [one(e) for e in self.options],
            "reason": self.reason,
            "notes": list(self.notes),
            "num_samples": self.num_samples,
            "job_samples": self.job_samples,
            "model_dim": None if isinstance(self.model_dim, StepCost) else self.model_dim,
            "step_cost": (
                dict(self.model_dim.seconds_per_token)
                if isinstance(self.model_dim, StepCost)
                else None
            ),
            "timing": asdict(self.timing),
            "tokens_per_batch": self.tokens_per_batch,
            "batch_size": self.batch_size,
        }


def _s(seconds: float) -> str:
    """Seconds for a reader: whole seconds from 100 up, three digits below."""
    return f"{seconds:,.0f}" if seconds >= 100 else f"{seconds:.3g}"


def _shapes(n: int) -> str:
    return f"{n} shape" if n == 1 else f"{n} shapes"


def _reason(chosen: StrategyEstimate, best: dict[tuple[str, str], StrategyEstimate]) -> str:
    """One sentence: the margin over the runner-up, and why this mode."""
    others = [e for e in best.values() if e is not chosen]
    runner = min(others, key=lambda e: e.job_seconds)
    margin = 1 - chosen.job_seconds / runner.job_seconds if runner.job_seconds else 0.0
    if margin < 5e-4:
        head = (
            f"estimated {_s(chosen.job_seconds)} s, the same as {runner.layout} {runner.mode} "
            "(a tie goes to the simpler mode)"
        )
    else:
        head = (
            f"estimated {_s(chosen.job_seconds)} s, {margin:.1%} less than the next best "
            f"({runner.layout} {runner.mode}, {_s(runner.job_seconds)} s)"
        )
    same = best[(chosen.layout, "eager")]
    first = best[(chosen.layout, "compile-first")]
    if chosen.mode == "eager":
        saved = same.train_seconds - first.train_seconds
        why = (
            f"compiling would save {_s(saved)} s of steps but its warm-up costs more "
            f"({_s(first.warmup_seconds)} s for {_shapes(first.num_shapes)})"
            if saved > 0
            else "the compiled step is not faster than the eager one"
        )
    elif chosen.mode == "compile-first":
        why = (
            f"the {_s(chosen.warmup_seconds)} s warm-up is won back: compiled steps save "
            f"{_s(same.train_seconds - chosen.train_seconds)} s, and compiling in the "
            "background would slow training more than it gains"
        )
    elif chosen.warmup_seconds <= chosen.job_seconds:
        why = (
            f"training starts at once and every shape runs compiled after "
            f"{_s(chosen.warmup_seconds)} s of background compiles, most frequent first"
        )
    else:
        why = (
            "training starts at once; the most frequent shapes are compiled in the background "
            f"while it runs (all {chosen.num_shapes} would take {_s(chosen.warmup_seconds)} s, "
            "longer than the job)"
        )
    return f"{head}; {why}"


def _notes(timing: StepTiming, model_dim: int | StepCost) -> list[str]:
    background = timing.background_compile_seconds or timing.compile_seconds
    if isinstance(model_dim, StepCost):
        cost = (
            "rows x L x the seconds per token measured at L (interpolated between "
            f"{list(model_dim.seconds_per_token)}; {model_dim.source})"
        )
    else:
        cost = f"rows*L*(1 + L/(6*{model_dim})) units (the formula)"
    return [
        f"every time is estimated, not measured: a batch of rows x L tokens costs {cost}, "
        f"scaled from the one timed {timing.rows}x{timing.length} step; per-step overheads "
        "and kernels that do not scale that way are not modelled",
        f"every shape is taken to compile in {timing.compile_seconds:g} s, the timed one",
        "compile-while-training: one background worker compiles the shapes one after another "
        f"({background:g} s each), switching a shape to compiled pauses training "
        f"{timing.load_seconds:g} s, each shape's batches are spread evenly through the job, and "
        f"training steps run {timing.contention:g}x slower while it compiles (contention; 1: it "
        "has a core of its own)",
        "one epoch's plan (padding, packing, short batches) is scaled to the job's samples",
    ]


def _chosen(
    estimates: list[StrategyEstimate],
) -> tuple[StrategyEstimate, dict[tuple[str, str], StrategyEstimate]]:
    """The option with the shortest job, and the best of every layout and mode; equal to
    9 digits is a tie (sums in another order differ in the last bit), which goes to the
    simpler mode, then to fewer shapes."""

    def key(e: StrategyEstimate) -> tuple[float, int, int]:
        return (float(f"{e.job_seconds:.9g}"), _RANK[e.mode], e.num_shapes)

    best: dict[tuple[str, str], StrategyEstimate] = {}
    for e in sorted(estimates, key=key):
        best.setdefault((e.layout, e.mode), e)
    return min(best.values(), key=key), best


def _all_estimates(
    sets: dict[str, list[ShapeSet]], timing: StepTiming, job_samples: int
) -> list[StrategyEstimate]:
    """Every shape set of each layout (``sets``: layout -> its sets), each in every mode;
    estimates that overflow a float are refused (the timed step's units are wrong)."""
    estimates = []
    for layout, shapes in sets.items():
        for buckets, rows, efficiency, loads in shapes:
            for mode in MODES:
                times = job_seconds(
                    mode,
                    loads,
                    timing.compile_seconds,
                    background_seconds=timing.background_compile_seconds,
                    contention=timing.contention,
                    load_seconds=timing.load_seconds,
                )
                estimates.append(
                    StrategyEstimate(layout, mode, buckets, rows, len(loads), efficiency, *times)
                )
    if not all(np.isfinite(e.job_seconds) for e in estimates):
        raise ShapeBucketError(
            f"the job's estimates overflow a float: {timing} scaled to {job_samples:,} samples; "
            "check the timed step's units (seconds per step)"
        )
    return estimates


def choose_strategy(
    lengths: Sequence[int] | np.ndarray,
    timing: StepTiming,
    *,
    model_dim: int | StepCost,
    job_samples: int,
    batch_size: int = 64,
    tokens_per_batch: int | None = None,
    k: int = 8,
    align: int = DEFAULT_ALIGN,
) -> StrategyReport:
    """Buckets or packing, eager, compile-first or compile-while-training, and the shapes:
    the option with the shortest estimated whole job (module docstring).

    Args:
        lengths: the dataset's sample lengths (one epoch).
        timing: the job's timings (:class:`StepTiming`: a timed step, or
            :func:`time_steps` on your model, and what compiling in the background costs).
        model_dim: the model's width (its hidden size: a token in a row of ``L`` costs
            ``1 + L / (6 * model_dim)``), or a :class:`~shapebucket.fit.step_cost.StepCost`
            measured per length, used instead of the formula; the notes say which.
        job_samples: samples the job trains on (epochs x dataset size).
        batch_size: rows of a bucketed batch.
        tokens_per_batch: a packed batch's tokens; default ``batch_size`` mean-length
            samples, rounded up to whole rows of the longest row length.
        k: the most shapes tried (bucket counts ``1..k``; :func:`fit_packing` ``k``).
        align: every bucket and row length is a multiple of this.

    (Examples: :class:`StrategyReport`.)
    """
    checked = CheckedLengths.of(lengths)
    if not isinstance(timing, StepTiming):
        raise ShapeBucketError(
            f"timing must be a StepTiming (compile_seconds, eager_seconds, compiled_seconds, "
            f"rows, length), got {type(timing).__name__}; time_steps(...) measures one"
        )
    model_dim = check_model_dim(model_dim)
    job_samples = check_int("job_samples", job_samples, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    k = check_int("k", k, minimum=1)
    align = check_int("align", align, minimum=1, maximum=MAX_BUCKET)
    if tokens_per_batch is None:
        tokens_per_batch = default_tokens(checked, batch_size, align)
    tokens = check_int("tokens_per_batch", tokens_per_batch, minimum=1)
    units = unit_cost(timing.rows, timing.length, model_dim)  # of the timed step
    rates = Rates(timing.eager_seconds / units, timing.compiled_seconds / units, model_dim)
    sets = {
        "buckets": bucket_sets(checked, k, align, batch_size, job_samples, rates),
        "packing": packing_sets(checked, k, align, tokens, job_samples, rates),
    }
    estimates = _all_estimates(sets, timing, job_samples)
    chosen, best = _chosen(estimates)
    return StrategyReport(
        chosen=chosen,
        options=sorted(best.values(), key=lambda e: (e.layout, _RANK[e.mode])),
        reason=_reason(chosen, best),
        notes=_notes(timing, model_dim),
        num_samples=len(checked),
        job_samples=job_samples,
        model_dim=model_dim,
        timing=timing,
        tokens_per_batch=tokens,
        batch_size=batch_size,
        estimates=estimates,
    )

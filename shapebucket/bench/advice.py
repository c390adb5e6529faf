"""``choose_strategy``'s recommendation from the fixed-length peers' measured step (one shape,
eager and compiled), for one and ten epochs, against the first shapebucket strategy to
finish as measured."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..advise import StepTiming, choose_strategy
from ..advise.strategy import StrategyEstimate
from .strategies import StrategyResult

__all__ = ["MEASURED_AS", "recommendation"]

#: (layout, mode) of each shapebucket strategy, as choose_strategy names them.
MEASURED_AS = {
    "shapebucket-packed": ("packing", "compile-first"),
    "shapebucket-packed-eager": ("packing", "eager"),
    "shapebucket-packed-background": ("packing", "compile-while-training"),
    "shapebucket": ("buckets", "compile-first"),
    "shapebucket-tokens": ("buckets", "compile-first"),
    "shapebucket-specialized": ("buckets", "compile-first"),
}


def _step_s(r: StrategyResult) -> float:
    """The median of the steady (not compiling) step times."""
    flags = set(r.compiled_steps)
    return float(np.median([t for i, t in enumerate(r.step_times) if i not in flags]))


def recommendation(
    results: Sequence[StrategyResult], lengths: np.ndarray, config: dict[str, Any]
) -> list[str]:
    """Lines to print: the recommendation for one and ten epochs and the agreement, or why
    there is none (the fixed-length peers not run)."""
    by = {r.name: r for r in results if r.error is None and r.step_times}
    eager, compiled = by.get("fixed-packed-eager"), by.get("fixed-packed-compile")
    if eager is None or compiled is None:
        return ["strategy advice: needs fixed-packed-eager and fixed-packed-compile (one shape)"]
    model = config["model"]
    rows = max(1, int(config["packed_tokens_per_batch"]) // int(model["max_len"]))
    # a background compile takes one of the cores training uses: steps run cores/(cores-1) slower
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    contention = cores / (cores - 1) if cores and cores > 1 else 2.0
    timing = StepTiming(
        compile_seconds=compiled.warmup_s,  # one graph, forward and backward, plus 3 steps
        eager_seconds=_step_s(eager),
        compiled_seconds=_step_s(compiled),
        rows=rows,
        length=int(model["max_len"]),
        contention=contention,
    )
    lines = [
        f"strategy advice (shapebucket.advise.choose_strategy from the measured {rows}x"
        f"{model['max_len']} step: compile {timing.compile_seconds:.1f} s, eager "
        f"{timing.eager_seconds * 1e3:.1f} ms, compiled {timing.compiled_seconds * 1e3:.1f} ms, "
        f"contention {contention:.2g}):"
    ]
    ours = [r for r in results if r.error is None and r.name in MEASURED_AS and r.job_s > 0]
    for epochs in (1, 10):
        report = choose_strategy(
            lengths,
            timing,
            model_dim=int(model["dim"]),
            job_samples=epochs * len(lengths),
            batch_size=int(config["batch_size"]),
            tokens_per_batch=int(config["packed_tokens_per_batch"]),
            k=int(config["k"]),
        )
        c = report.chosen
        line = (
            f"  {epochs} epoch{'s' if epochs > 1 else ''}: recommends {c.layout} {c.mode}, "
            f"{c.num_shapes} shapes, estimated {c.job_seconds:,.0f} s"
        )
        if ours:
            line += _agreement(epochs, c, ours)
        lines.append(line)
    return lines


def _agreement(epochs: int, c: StrategyEstimate, ours: list[StrategyResult]) -> str:
    """Whether the first of ``ours`` to finish ``epochs`` epochs (as measured) has the
    layout and mode of the recommended option ``c``."""
    first = min(ours, key=lambda r: r.job_s if epochs == 1 else r.job10_s)
    measured = first.job_s if epochs == 1 else first.job10_s
    agree = MEASURED_AS[first.name] == (c.layout, c.mode)
    line = (
        f"; the first shapebucket strategy to finish: {first.name} "
        f"({' '.join(MEASURED_AS[first.name])}) {measured:,.0f} s: {'agrees' if agree else 'disagrees'}"
    )
    if c.mode == "compile-while-training" and not any(
        MEASURED_AS[r.name][1] == c.mode for r in ours
    ):
        line += " (compile-while-training is not measured by this benchmark)"
    return line

"""The physical limit, a reference row: the rate on the timed set's real tokens with no
padding and no attention across samples (full batches at grid lengths, eager and compiled,
the faster kept, interpolated), and :func:`gap`, where a strategy's time goes beyond it
(docs/benchmarks.md, "The physical limit")."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._lengths import round_up
from .batching import Family
from .runner import Runner, fresh_forward
from .strategies import StrategyResult

__all__ = [
    "LIMIT",
    "add_limit",
    "gap",
    "limit_grid",
    "limit_headline",
    "limit_line",
    "limit_rate",
    "limit_runners",
]

LIMIT = "limit"


def limit_grid(lengths: np.ndarray, points: int) -> list[int]:
    """``points`` grid lengths, geometric from the shortest to the longest length, each
    rounded up to a multiple of 8.

    >>> limit_grid(np.array([3, 40, 250]), 4)
    [8, 32, 80, 256]
    """
    lo, hi = max(8, int(lengths.min())), max(8, int(lengths.max()))
    raw = np.geomspace(lo, hi, num=max(2, points)) if hi > lo else np.array([hi])
    return sorted({int(round_up(int(np.ceil(x)), 8)) for x in raw})


def limit_rate(lengths: np.ndarray, cost: dict[int, float]) -> float:
    """Real tokens per second over ``lengths`` at ``cost[L]`` seconds per token, linear
    between grid lengths.

    >>> limit_rate(np.array([8, 16]), {8: 1.0, 16: 2.0})  # 24 tokens in 8 + 32 s
    0.6
    """
    grid = sorted(cost)
    per_token = np.interp(lengths, grid, [cost[L] for L in grid])
    return float(lengths.sum() / float((lengths * per_token).sum()))


def gap(
    lengths: np.ndarray,
    cost: dict[int, float],
    batches: Sequence[tuple[int, int, int]],
    rate: float,
) -> dict[str, float]:
    """Where a strategy's seconds go beyond the limit's, as shares of its measured time:
    ``batches`` are ``(rows, length, real tokens)`` of its timed epoch, ``rate`` its useful
    tokens/sec over the real ``lengths``. Keys: ``limit``, ``padding``, ``longer rows``,
    ``per step`` (sum 1; ``per step`` can be negative where its batches ran faster than
    the grid's full batches predict).

    >>> g = gap(np.array([8, 8]), {8: 1.0, 16: 1.5}, [(1, 16, 16)], rate=16 / 32)
    >>> {k: round(v, 3) for k, v in g.items()}
    {'limit': 0.5, 'padding': 0.0, 'longer rows': 0.25, 'per step': 0.25}
    """
    grid = sorted(cost)
    c = dict(zip(grid, [cost[L] for L in grid], strict=True))

    def at(L: int) -> float:
        return float(np.interp(L, grid, [c[g] for g in grid]))

    ideal = float(lengths.sum()) / limit_rate(lengths, cost)
    padding = sum((rows * L - real) * at(L) for rows, L, real in batches)
    longer = sum(real * at(L) for _, L, real in batches) - ideal
    measured = float(lengths.sum()) / rate
    return {
        "limit": ideal / measured,
        "padding": padding / measured,
        "longer rows": longer / measured,
        "per step": (measured - ideal - padding - longer) / measured,
    }


def _grid_batches(s: Any, grid: list[int], rows: dict[int, int]) -> list[dict[str, Any]]:
    """Full batches at each grid length, as many at each as hold about the timed set's
    tokens nearest that length (at least one), ordered by length."""
    lengths = s.lengths[s.timed_ids]
    nearest = np.abs(lengths[:, None] - np.asarray(grid)[None, :]).argmin(axis=1)
    tokens = np.bincount(nearest, weights=lengths, minlength=len(grid))
    g = torch.Generator().manual_seed(s.args.seed)
    batches = []
    for i, L in enumerate(grid):
        for _ in range(max(1, round(float(tokens[i]) / (rows[L] * L)))):
            ids = torch.randint(0, int(s.model_config["vocab"]), (rows[L], L), generator=g)
            batches.append(
                {
                    "input_ids": ids.to(s.device),
                    "labels": ids.roll(-1, 1).to(s.device),
                    "attention_mask": torch.ones_like(ids, dtype=torch.bool).to(s.device),
                }
            )
    return batches


def limit_runners(s: Any, hows: Sequence[str] = ("eager", "compiled")) -> list[Runner]:
    """A runner per way of running (``hows``) for the harness' interleaved rounds, timing
    full batches of the packed strategy's token budget at the grid lengths, warmed up here
    (every grid length compiled); none for the captioning workload."""
    if s.args.workload == "captioning" and s.args.lengths is None:
        return []
    grid = limit_grid(s.lengths[s.timed_ids], 3 if s.args.quick else 5)
    rows = {L: max(1, int(s.args.packed_tokens_per_batch) // L) for L in grid}
    runners = []
    for how in hows:
        name = f"{LIMIT}-{how}"
        batches = _grid_batches(s, grid, rows)
        family = Family(collate=None, epoch=[], shapes=[], timed=batches)  # type: ignore[arg-type]
        family.timed_real = [int(b["input_ids"].numel()) for b in batches]
        result = StrategyResult(name=name, family=LIMIT)
        result.limit = {"grid": grid, "rows": rows}
        fwd: Any = fresh_forward(f"{LIMIT}_{how}")  # dynamic=False: a graph per grid length
        if how == "compiled":
            fwd = torch.compile(fwd, fullgraph=True, dynamic=False, mode=s.args.mode)
        step = s.training_step(fwd)[0]
        t0 = time.perf_counter()
        for L in grid:  # compile each grid length before the rounds
            step(next(b for b in batches if b["input_ids"].shape[1] == L))
        result.warmup_s = time.perf_counter() - t0
        runners.append(Runner(name, family, step, contextlib.nullcontext, result, 0))
    return runners


def _round_costs(r: Runner) -> list[dict[int, float]]:
    """Seconds per token at each grid length, one dict per timed round."""
    batches = r.family.timed
    n = len(batches)
    out = []
    for k in range(len(r.result.step_times) // n):
        times = r.result.step_times[k * n : (k + 1) * n]
        seconds: dict[int, float] = {}
        tokens: dict[int, int] = {}
        for b, t in zip(batches, times, strict=True):
            L = int(b["input_ids"].shape[1])
            seconds[L] = seconds.get(L, 0.0) + t
            tokens[L] = tokens.get(L, 0) + int(b["input_ids"].numel())
        out.append({L: seconds[L] / tokens[L] for L in seconds})
    return out


def add_limit(
    s: Any, families: dict[str, Any], results: list[StrategyResult], runners: list[Runner]
) -> None:
    """Append the ``limit`` row from the timed ``runners`` to ``results`` (each grid length
    at the faster of eager and compiled, its median over the rounds; the min-max are the
    rounds' own rates), and give every strategy its share of it (``of_limit``) and its
    :func:`gap`, both at the same costs."""
    ok = [r for r in runners if r.result.error is None and r.result.step_times]
    if not ok:
        error = next((r.result.error for r in runners if r.result.error), None)
        results.append(
            StrategyResult(
                name=LIMIT, family=LIMIT, error=error or "skipped: the limit runs the GPT"
            )
        )
        return
    lengths = s.lengths[s.timed_ids].astype(np.int64)
    per_round = {r.name.split("-", 1)[1]: _round_costs(r) for r in ok}
    rounds = min(len(v) for v in per_round.values())
    grid = ok[0].result.limit["grid"]  # type: ignore[index]
    costs = [{L: min(v[k][L] for v in per_round.values()) for L in grid} for k in range(rounds)]
    rates = [limit_rate(lengths, c) for c in costs]
    median = {L: statistics.median(c[L] for c in costs) for L in grid}
    row = StrategyResult(name=LIMIT, family=LIMIT, round_tokens_per_sec=[])
    # at each length's median cost (what gap() uses, so a share and its gap agree); the
    # min-max are the rounds' own rates
    row.useful_tokens_per_sec = limit_rate(lengths, median)
    row.tokens_per_sec_min, row.tokens_per_sec_max = min(rates), max(rates)
    row.warmup_s = sum(r.result.warmup_s for r in ok)
    row.limit = {
        **ok[0].result.limit,  # type: ignore[dict-item]
        **{
            how: {L: statistics.median(c[L] for c in v[:rounds]) for L in grid}
            for how, v in per_round.items()
        },
        "cost": median,
    }
    for r in results:
        fam = families.get(r.family)
        if r.error is not None or fam is None or not r.useful_tokens_per_sec:
            continue
        r.of_limit = r.useful_tokens_per_sec / row.useful_tokens_per_sec
        shapes = [
            (int(b["input_ids"].shape[0]), int(b["input_ids"].shape[1]), real)
            for b, real in zip(fam.timed, fam.timed_real, strict=True)
        ]
        r.limit_gap = gap(lengths, median, shapes, r.useful_tokens_per_sec)
    results.append(row)


def limit_line(r: StrategyResult) -> str:
    """The limit's row in the table: its rate and how it was measured."""
    if r.error is not None:
        return f"{LIMIT + ' (reference)':<29s} {r.error}"
    info = r.limit or {}
    grid = info.get("grid", [])
    eager, compiled = info.get("eager", {}), info.get("compiled", {})
    faster = [
        "compiled"
        if compiled.get(L, compiled.get(str(L), 0)) < eager.get(L, eager.get(str(L), 0))
        else "eager"
        for L in grid
    ]
    return (
        f"{LIMIT + ' (reference)':<29s} {r.useful_tokens_per_sec:>12,.0f} "
        f"{f'{r.tokens_per_sec_min / 1e3:,.1f}k-{r.tokens_per_sec_max / 1e3:,.1f}k':>15s}  no "
        f"padding, no attention across samples: full batches at lengths {grid} (faster: "
        f"{', '.join(faster)}), interpolated, weighted by the timed set's tokens"
    )


def limit_headline(results: Sequence[StrategyResult]) -> str | None:
    """How far the fastest shapebucket strategy is from the limit, and where the rest goes."""
    limit = next((r for r in results if r.family == LIMIT and r.error is None), None)
    ours = [r for r in results if not r.peer and r.of_limit is not None and r.family != LIMIT]
    if limit is None or not ours:
        return None
    best = max(ours, key=lambda r: r.useful_tokens_per_sec)
    g = best.limit_gap or {}
    share = best.of_limit or 0.0
    line = (
        f"limit: {best.name} reaches {share:.0%} of the limit "
        f"({limit.useful_tokens_per_sec:,.0f} useful tok/s on this machine); of its time, "
        f"{g.get('limit', 0):.0%} is the limit's own work, {g.get('padding', 0):.0%} padding, "
        f"{g.get('longer rows', 0):.0%} attention across a row's other samples (its real tokens "
        f"at their row's cost per token instead of their own), {_rest(g.get('per step', 0.0))}"
    )
    if share > 1:
        line += (
            "; above the limit: here a token costs less in a longer row than in a batch of its "
            "own length (per-row costs outweigh attention), so the limit is a reference, not a bound"
        )
    return line


def _rest(share: float) -> str:
    """The per-step overhead, the time the other parts leave; when they leave none (they add
    up to more than the step, within timing noise) it says so rather than print "-0%".

    >>> _rest(0.12)
    '12% per-step overhead (the rest)'
    >>> _rest(-0.003)
    '0% per-step overhead (the rest)'
    >>> _rest(-0.04)
    'no per-step overhead left (the other parts add up to 4% more than the step: timing noise)'
    """
    if share > -0.005:
        return f"{max(share, 0.0):.0%} per-step overhead (the rest)"
    return f"no per-step overhead left (the other parts add up to {-share:.0%} more than the step: timing noise)"

"""The search behind :func:`~shapebucket.fit.packing_fit.fit_packing`: which row-length
sets to plan for real (the space, the objective and the steps: ``docs/fit.md``, "Packed
row lengths")."""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import combinations

import numpy as np

from .._lengths import round_up
from ._packer import Packer
from .buckets import Buckets
from .optimal import Cost, weighted_fit
from .packing import rows_for_tokens
from .step_cost import StepCost, row_cost

__all__ = [
    "EXHAUSTIVE_WORK",
    "PAIR_SEED_WORK",
    "PROBE",
    "best_sets",
    "halving_sets",
    "search_row_lengths",
]

#: sets x samples up to which every set of the space is packed (exact search)
EXHAUSTIVE_WORK = 300_000
#: pairs x samples up to which every two-length set ``(b, top)`` seeds the search
PAIR_SEED_WORK = 300_000
#: the most lengths each candidate is packed on during the search
PROBE = 8192
#: packings the hill climb may spend (after the seeds and their alternations)
CLIMB_BUDGET = 24
#: row lengths dropped one by one from the best set, for the sets of fewer shapes
PRUNE_LEVELS = 3
#: how many of the search's best sets are planned on all the lengths, next to the reference
FINALISTS = 3
_ROUNDS = 6  # alternations per seed, at most


def halving_sets(top: int, k: int, align: int) -> list[Buckets]:
    """``[M]``, ``[M/2, M]``, ``[M/4, M/2, M]``, ... (at most ``k`` row lengths, each rounded
    up to ``align``, at least ``2 * align`` and at most ``M``), stopping when a set repeats.

    >>> [list(b) for b in halving_sets(256, 3, 8)]
    [[256], [128, 256], [64, 128, 256]]
    """
    floor = min(top, max(2, 2 * align))
    out: list[Buckets] = []
    for m in range(1, k + 1):
        values = sorted({max(floor, round_up(-(-top // 2**i), align)) for i in range(m)} | {top})
        if out and list(out[-1]) == values:
            break
        out.append(Buckets(values))
    return out


def best_sets(scores: dict[tuple[int, ...], float], n: int, within: float = 0.02) -> list[Buckets]:
    """At most ``n`` of the scored sets (lower is better): the best one, then for each
    smaller number of row lengths its best set, fewest first, kept when its score is within
    ``within`` (relative) of the best: fewer row lengths (compiles) that nearly match stay
    in the running."""
    ranked = sorted(scores, key=lambda s: (scores[s], len(s)))
    per_size: dict[int, tuple[int, ...]] = {}
    for s in ranked:
        per_size.setdefault(len(s), s)
    first = ranked[0]
    limit = scores[first] * (1 + within)
    smaller = [
        per_size[m] for m in sorted(per_size) if m < len(first) and scores[per_size[m]] <= limit
    ]
    return [Buckets(list(s)) for s in [first, *smaller][:n]]


class _Evaluator:
    """Packs ``probe`` with a set and scores it; remembers every score."""

    def __init__(
        self,
        probe: np.ndarray,
        tokens: int,
        model_dim: int | StepCost | None,
        pad_rows: bool,
        seed: int,
        window: int,
    ) -> None:
        self.probe, self.tokens, self.pad_rows = probe, tokens, pad_rows
        self.cost = row_cost(model_dim)
        self.dp_cost: Cost = "tokens" if model_dim is None else self.cost
        self.order = np.random.default_rng([seed, 0]).permutation(len(probe)).astype(np.int64)
        self.window = window
        self.scores: dict[tuple[int, ...], float] = {}  # every set packed, in the order tried
        self.real = float(probe.sum())

    def __call__(self, values: tuple[int, ...]) -> tuple[float, np.ndarray]:
        """``(score, contents)``: the set's objective and the real tokens of each row."""
        per = rows_for_tokens(list(values), self.tokens)
        packer = Packer(self.probe, per, 1).pack(self.order, self.window)
        rows, Ls, R = packer.rows, packer.Ls, packer.R
        cls = rows.cls[: rows.n]
        row_len = Ls[cls]
        costs = np.asarray([self.cost(int(L)) for L in values])
        work = float(costs[cls].sum())
        if self.pad_rows:  # a short batch's empty rows; not on a probe (it has fewer)
            steps = np.asarray(packer.step_cls, dtype=np.int64)
            filled = np.bincount(rows.step[: rows.n], minlength=len(steps))
            work += float(((R[steps] - filled) * costs[steps]).sum())
        score = work / self.real if self.real else 1.0
        self.scores.setdefault(values, score)
        return score, row_len - rows.rem[: rows.n]

    def score(self, values: tuple[int, ...]) -> float:
        known = self.scores.get(values)
        return known if known is not None else self(values)[0]


def _space_size(u: int, k: int) -> int:
    return sum(math.comb(u, m) for m in range(min(k - 1, u) + 1))


def _neighbours(
    cur: tuple[int, ...], universe: list[int], top: int, k: int
) -> Iterator[tuple[int, ...]]:
    """Sets one step from ``cur``: a row length dropped, added, or moved (``top`` stays)."""
    inner = [b for b in cur if b != top]
    for b in inner:
        yield tuple(x for x in cur if x != b)
    free = [u for u in universe if u not in cur]
    if len(cur) < k:
        for u in free:
            yield tuple(sorted((*cur, u)))
    for b in inner:
        for u in free:
            yield tuple(sorted([x for x in cur if x != b] + [u]))


def _alternate(ev: _Evaluator, seed_set: tuple[int, ...], k: int, align: int, top: int) -> None:
    """Pack, refit the set exactly to the rows' contents, re-pack, until the set repeats."""
    values = seed_set
    for _ in range(_ROUNDS):
        if values in ev.scores:
            return
        _, contents = ev(values)
        contents = contents[contents > 0]
        if not len(contents):
            return
        values = _refit(contents, k, align, top, ev.dp_cost)


def _refit(lengths: np.ndarray, k: int, align: int, top: int, cost: Cost) -> tuple[int, ...]:
    """The exact best ``k`` row lengths for ``lengths`` (ints >= 1, <= ``top``), the
    largest covering ``top`` (a candidate no length weighs)."""
    weights = np.append(np.ones(len(lengths)), 0.0)
    return tuple(weighted_fit(np.append(lengths, top), weights, k, align, cost=cost))


def _climb(ev: _Evaluator, universe: list[int], top: int, k: int, budget: int) -> None:
    """First-improvement hill climb from the best set so far, ``budget`` new packings.

    A step to a set that scores the same is taken too, once per set: on a plateau (a
    row length added that no row uses yet) the next move may descend, which a strict
    climb never sees (``[24, 64] -> [24, 32, 64] -> [32, 40, 64]``)."""
    cur = min(ev.scores, key=lambda s: (ev.scores[s], len(s)))
    best = ev.scores[cur]
    visited = {cur}
    spent = 0
    improved = True
    while improved and spent < budget:
        improved = False
        for nxt in _neighbours(cur, universe, top, k):
            if spent >= budget:
                break
            if nxt not in ev.scores:
                spent += 1
            score = ev.score(nxt)
            sideways = score <= best + 1e-12 and nxt not in visited
            if score < best - 1e-12 or sideways:
                cur, best, improved = nxt, min(best, score), True
                visited.add(nxt)
                break


def _prune(ev: _Evaluator, top: int, levels: int) -> None:
    """From the best set, drop the row length that costs least, ``levels`` times: each
    smaller size gets a good candidate (fewer shapes are fewer compiles)."""
    cur = min(ev.scores, key=lambda s: (ev.scores[s], len(s)))
    for _ in range(levels):
        smaller = [tuple(x for x in cur if x != b) for b in cur if b != top]
        if not smaller:
            return
        cur = min(smaller, key=lambda s: (ev.score(s), s))


def search_row_lengths(
    lengths: np.ndarray,
    *,
    k: int,
    top: int,
    align: int,
    tokens_per_batch: int,
    model_dim: int | StepCost | None,
    seed: int,
    window: int,
) -> list[Buckets]:
    """The search's best sets (:func:`best_sets`); ``lengths`` are checked ints <= ``top``."""
    probe = lengths
    if len(lengths) > PROBE:
        probe = np.random.default_rng([seed, 2]).choice(lengths, size=PROBE, replace=False)
    ev = _Evaluator(probe, tokens_per_batch, model_dim, len(probe) == len(lengths), seed, window)
    low = min(top, round_up(2, align))
    universe = list(range(low, top, align))
    if _space_size(len(universe), k) * len(probe) <= EXHAUSTIVE_WORK:
        for m in range(min(k - 1, len(universe)) + 1):
            for inner in combinations(universe, m):
                ev((*inner, top))
        return best_sets(ev.scores, FINALISTS)
    seeds = [tuple(b) for b in halving_sets(top, k, align)]
    seeds.append(_refit(lengths, k, align, top, ev.dp_cost))
    for s in seeds:
        _alternate(ev, s, k, align, top)
    if k > 1 and len(universe) * len(probe) <= PAIR_SEED_WORK:  # every pair, when affordable
        for b in universe:
            ev.score((b, top))
    _climb(ev, universe, top, k, CLIMB_BUDGET)
    _prune(ev, top, PRUNE_LEVELS)
    return best_sets(ev.scores, FINALISTS)

"""The benchmark's results: the headline, the loss-agreement check, the table and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._argparse import pyplot
from .limit import LIMIT, limit_headline, limit_line
from .strategies import StrategyResult

__all__ = ["Headline", "check_losses", "format_table", "headline", "plot", "run_payload"]


def _span(values: Sequence[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (float("nan"), float("nan"))


@dataclass(frozen=True)
class Headline:
    """shapebucket against the best strategy without it, of any kind (eager and fixed-length
    packing included): by steady-state speed (the fastest of each side), and by the whole
    job of one and of ten epochs, warm-up included (the first of each side to finish).
    Each ratio comes with the min-max of the same ratio taken round by round (the rounds
    are interleaved, so round ``i`` of both ran under the same load). ``grouped`` is the
    fastest length-grouped peer, against which the ceiling is defined."""

    ours: StrategyResult
    peer: StrategyResult
    job_ours: StrategyResult
    job_peer: StrategyResult
    job10_ours: StrategyResult
    job10_peer: StrategyResult
    grouped: StrategyResult | None = None

    @property
    def ratio(self) -> float:
        """Median useful tokens/sec, ours over the peer's (below 1: the peer is faster)."""
        return self.ours.useful_tokens_per_sec / self.peer.useful_tokens_per_sec

    def speed_rounds(self, peer: StrategyResult | None = None) -> list[float]:
        """Ours over ``peer``'s (default: the best peer's) useful tokens/sec, round by round."""
        other = peer or self.peer
        return [
            a / b
            for a, b in zip(
                self.ours.round_tokens_per_sec, other.round_tokens_per_sec, strict=False
            )
        ]

    def job_rounds(self, epochs: int) -> list[float]:
        """The peer's whole job over ours (above 1: ours first), round by round."""
        a, b = (self.job_ours, self.job_peer) if epochs == 1 else (self.job10_ours, self.job10_peer)
        return [
            b.job_seconds(epochs, eb) / a.job_seconds(epochs, ea)
            for ea, eb in zip(a.round_epoch_s, b.round_epoch_s, strict=False)
        ]

    @property
    def within_noise(self) -> bool:
        """Whether the two strategies' min-max ranges over the timed rounds overlap."""
        a, b = self.ours, self.peer
        return (
            a.tokens_per_sec_min <= b.tokens_per_sec_max
            and b.tokens_per_sec_min <= a.tokens_per_sec_max
        )

    @property
    def job_ratio(self) -> float:
        """One epoch's time with warm-up, the peer's over ours (above 1: ours finishes first)."""
        return self.job_peer.job_s / self.job_ours.job_s

    @property
    def job10_ratio(self) -> float:
        """Ten epochs' time with warm-up, the peer's over ours (above 1: ours finishes first)."""
        return self.job10_peer.job10_s / self.job10_ours.job10_s

    @property
    def ceiling(self) -> float | None:
        """The steady-state ceiling against the fastest grouped peer: the ratio of real-token
        shares (ours over its), what removing all padding could at best gain."""
        if self.grouped is None or not self.grouped.token_efficiency:
            return None
        return self.ours.token_efficiency / self.grouped.token_efficiency

    def __str__(self) -> str:
        verdict = (
            "within noise (the rounds' ranges overlap)"
            if self.within_noise
            else ("faster" if self.ratio > 1 else "slower")
        )
        lo, hi = _span(self.speed_rounds())
        j1, j10 = self.job_rounds(1), self.job_rounds(10)
        lines = [
            f"headline: {self.ours.name} {self.ours.useful_tokens_per_sec:,.0f} useful tok/s = "
            f"{self.ratio:.2f}x [rounds {lo:.2f}-{hi:.2f}] the best strategy without shapebucket "
            f"({self.peer.name}, {self.peer.useful_tokens_per_sec:,.0f}): {verdict}; peak memory "
            f"of a step {self.ours.peak_mem_mb:,.0f} MB vs {self.peer.peak_mem_mb:,.0f} MB",
            _job_line("one epoch", self.job_ours, self.job_peer, self.job_ratio, j1, 1),
            _job_line("ten epochs", self.job10_ours, self.job10_peer, self.job10_ratio, j10, 10),
        ]
        ceiling, g = self.ceiling, self.grouped
        if ceiling is not None and g is not None:
            ratio = self.ours.useful_tokens_per_sec / g.useful_tokens_per_sec
            glo, ghi = _span(self.speed_rounds(g))
            lines.append(
                f"ceiling: real-token share {self.ours.token_efficiency:.1%} ({self.ours.name}) / "
                f"{g.token_efficiency:.1%} ({g.name}, the fastest grouped peer) = {ceiling:.2f}x; "
                f"measured {ratio:.2f}x [rounds {glo:.2f}-{ghi:.2f}] = {ratio / ceiling:.0%} of it"
            )
        return "\n".join(lines)


def _job_line(
    what: str, ours: StrategyResult, peer: StrategyResult, ratio: float, rounds: list[float], n: int
) -> str:
    a, b = (ours.job_s, peer.job_s) if n == 1 else (ours.job10_s, peer.job10_s)
    lo, hi = _span(rounds)
    first = "shapebucket first" if ratio > 1 else "the peer first"
    return (
        f"whole job ({what}, warm-up included): {ours.name} {a:,.0f} s vs {peer.name} {b:,.0f} s "
        f"= {ratio:.2f}x [rounds {lo:.2f}-{hi:.2f}] ({first})"
    )


def headline(results: Sequence[StrategyResult]) -> Headline | None:
    """The best shapebucket strategy and the best peer (eager and fixed-length packing
    included), by median useful tokens/sec and by whole-job time for one and ten epochs."""
    ok = [r for r in results if r.error is None and r.round_tokens_per_sec]
    ours = [r for r in ok if not r.peer]
    peers = [r for r in ok if r.peer]
    if not ours or not peers:
        return None

    def fastest(rs: list[StrategyResult]) -> StrategyResult:
        return max(rs, key=lambda r: r.useful_tokens_per_sec)

    def first(rs: list[StrategyResult], ten: bool = False) -> StrategyResult:
        return min(rs, key=lambda r: r.job10_s if ten else r.job_s)

    grouped = [r for r in peers if r.family == "grouped"]
    return Headline(
        fastest(ours),
        fastest(peers),
        first(ours),
        first(peers),
        first(ours, True),
        first(peers, True),
        fastest(grouped) if grouped else None,
    )


def check_losses(
    results: Sequence[StrategyResult], rtol: float = 2e-3, atol: float = 2e-3
) -> list[str]:
    """One line per step loss on which strategies of one family (the same batches in the same
    order) disagree: compiling, or marking dims dynamic must not change it."""
    problems = []
    families: dict[str, list[StrategyResult]] = {}
    for r in results:
        if r.error is None and r.losses:
            families.setdefault(r.family, []).append(r)
    for same in families.values():
        ref = same[0]
        for r in same[1:]:
            a, b = np.asarray(ref.losses), np.asarray(r.losses)
            if a.shape != b.shape:
                problems.append(f"{r.name}: {len(b)} losses vs {len(a)} for {ref.name}")
                continue
            bad = np.flatnonzero(~np.isclose(b, a, rtol=rtol, atol=atol))
            if bad.size:
                i = int(bad[0])
                problems.append(
                    f"{r.name}: step {i} loss {b[i]:.6f} vs {a[i]:.6f} for {ref.name} "
                    f"({bad.size} of {len(a)} steps differ beyond rtol={rtol}, atol={atol})"
                )
    return problems


def _steps_lines(ranked: Sequence[StrategyResult]) -> list[str]:
    """Steps/sec beside useful tokens/sec (median round), and the memory CUDA graphs keep."""
    ok = [r for r in ranked if r.error is None and r.family != LIMIT]
    lines = ["steps/s: " + ", ".join(f"{r.name} {r.steps_per_sec:,.2f}" for r in ok)]
    graphs = [r for r in ok if r.graph_memory_mb is not None]
    if graphs:
        lines.append(
            "CUDA graphs keep: "
            + ", ".join(f"{r.name} {r.graph_memory_mb:,.0f} MB" for r in graphs)
        )
    return lines


def format_table(results: Sequence[StrategyResult]) -> str:
    """One row per strategy, fastest first: median and range of the rounds, the ratio to the
    best peer, peak memory of a step, warm-up, one epoch, the whole job of one and ten
    epochs, compiles and token efficiency."""
    head_ = headline(results)
    best_peer = head_.peer.useful_tokens_per_sec if head_ else None
    ranked = sorted(results, key=lambda r: -r.useful_tokens_per_sec if r.error is None else 0)
    head = (
        f"{'strategy':<29s} {'useful tok/s':>12s} {'rounds min-max':>15s} {'vs peer':>7s} "
        f"{'peak MB':>7s} {'1st step s':>10s} {'warm-up s':>9s} {'epoch s':>7s} {'job 1 s':>7s} "
        f"{'job 10 s':>8s} "
        f"{'graphs':>6s} {'timed re':>8s} {'tok eff':>7s} {'timed':>5s} {'shapes':>6s} "
        f"{'of limit':>8s}"
    )
    lines = [head, "-" * len(head)]
    for r in ranked:
        if r.family == LIMIT:
            lines.append(limit_line(r))
            continue
        if r.error is not None:
            lines.append(f"{r.name:<29s} {r.error}")
            continue
        ratio = f"{r.useful_tokens_per_sec / best_peer:6.2f}x" if best_peer else "    -  "
        span = f"{r.tokens_per_sec_min / 1e3:,.1f}k-{r.tokens_per_sec_max / 1e3:,.1f}k"
        lines.append(
            f"{r.name:<29s} {r.useful_tokens_per_sec:>12,.0f} {span:>15s} {ratio:>7s} "
            f"{r.peak_mem_mb:>7,.0f} {r.first_step_s:>10.1f} {r.warmup_s:>9.1f} {r.epoch_s:>7.0f} "
            f"{r.job_s:>7.0f} "
            f"{r.job10_s:>8.0f} {r.graphs:>6d} {r.timed_recompiles:>8d} "
            f"{r.token_efficiency:>7.1%} {r.timed_token_efficiency:>5.0%} {r.shapes:>6d} "
            f"{'-' if r.of_limit is None else f'{r.of_limit:.0%}':>8s}"
        )
    lines += _steps_lines(ranked)
    lines.append(
        "useful tok/s: real tokens per second, median of the rounds (each one whole epoch of the "
        "timed set); vs peer: relative to the best strategy without shapebucket; peak MB: tensor "
        "memory one step of its largest batch allocates (torch.profiler); 1st step s: from the "
        "start (compile and prewarm included) to the end of the first training step; warm-up s: "
        "until every shape is compiled; epoch s: one "
        "epoch of the whole dataset at the median speed; job 1/10 s: warm-up + the 1/10 epochs "
        "its training steps have not covered yet; timed re: "
        "graphs compiled while timed; tok eff and shapes: over the whole dataset's epoch; timed: "
        "real-token share of the timed set's batches; of limit: useful tok/s over the limit's "
        "(a reference, not a peer: the same real tokens with no padding and no attention across "
        "samples)"
    )
    if head_ is not None:
        lines.append(str(head_))
    line = limit_headline(results)
    if line is not None:
        lines.append(line)
    return "\n".join(lines)


def plot(results: Sequence[StrategyResult], path: str | Path, title: str) -> None:
    """Two panels: useful tokens/sec (median, min-max bars, ratio to the best peer) and the
    whole job's seconds (warm-up and training stacked)."""
    from matplotlib.patches import Patch

    plt = pyplot()
    ok = sorted(
        (r for r in results if r.error is None and r.round_tokens_per_sec),
        key=lambda r: -r.useful_tokens_per_sec,
    )
    if not ok:
        return
    head_ = headline(ok)
    colors = ["#4c72b0" if r.peer else "#55a868" for r in ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 0.55 * len(ok) + 2.2))
    _speed_panel(a, ok, colors, head_.peer.useful_tokens_per_sec if head_ else None)
    _job_panel(b, ok, colors)
    fig.legend(
        handles=[
            Patch(color="#55a868", label="shapebucket"),
            Patch(color="#4c72b0", label="without shapebucket (peers)"),
            Patch(color="#c44e52", label="warm-up and compiles"),
        ],
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(_suptitle(title, head_), fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _speed_panel(
    a: Any, ok: Sequence[StrategyResult], colors: list[str], best_peer: float | None
) -> None:
    """The left panel: median useful tokens/sec with min-max bars and the ratio to the best peer."""
    names = [r.name for r in ok]
    med = np.array([r.useful_tokens_per_sec for r in ok])
    err = np.array(
        [
            [m - r.tokens_per_sec_min for m, r in zip(med, ok, strict=True)],
            [r.tokens_per_sec_max - m for m, r in zip(med, ok, strict=True)],
        ]
    )
    a.barh(names, med, xerr=err, color=colors, capsize=3)
    for y, m in enumerate(med):
        label = f"{m / 1e3:,.1f}k" + (f"  {m / best_peer:.2f}x" if best_peer else "")
        a.text(m + err[1][y], y, "  " + label, va="center", fontsize=8)
    a.set_xlabel("useful (real) tokens / s: median of rounds, bars min-max; higher is better")
    a.set_xlim(0, float((med + err[1]).max()) * 1.3)
    a.invert_yaxis()


def _job_panel(b: Any, ok: Sequence[StrategyResult], colors: list[str]) -> None:
    """The right panel: one epoch's seconds, warm-up and compiles stacked under training."""
    names = [r.name for r in ok]
    warm = np.array([r.warmup_s + r.timed_compile_s for r in ok])
    train = np.array([r.job_s for r in ok]) - warm
    b.barh(names, warm, color="#c44e52", label="warm-up and compiles")
    b.barh(names, train, left=warm, color=colors, label="training (one epoch)")
    for y, r in enumerate(ok):
        b.text(r.job_s, y, f"  {r.job_s:,.0f} s", va="center", fontsize=8)
    b.set_xlabel("one epoch, warm-up included (s); lower is better")
    b.set_xlim(0, max(r.job_s for r in ok) * 1.25)
    b.invert_yaxis()
    b.set_yticklabels([])


def _suptitle(title: str, head_: Headline | None) -> str:
    """The plot's title with the headline's speed ratio and one-epoch times under it."""
    if head_ is None:
        return title
    return title + (
        f"\nspeed: {head_.ours.name} = {head_.ratio:.2f}x {head_.peer.name}"
        + (" (within noise)" if head_.within_noise else "")
        + f"; one epoch: {head_.job_ours.name} {head_.job_ours.job_s:.0f} s vs "
        f"{head_.job_peer.name} {head_.job_peer.job_s:.0f} s"
    )


def run_payload(
    config: dict[str, Any],
    head: Headline | None,
    results: Sequence[StrategyResult],
) -> dict[str, Any]:
    """What ``--json`` saves: the configuration, the headline and every result."""
    headline_ = None
    if head is not None:
        headline_ = {
            "ours": head.ours.name,
            "peer": head.peer.name,
            "ratio": head.ratio,
            "ratio_rounds": head.speed_rounds(),
            "within_noise": head.within_noise,
            "job_ours": head.job_ours.name,
            "job_peer": head.job_peer.name,
            "job_ratio": head.job_ratio,
            "job_ratio_rounds": head.job_rounds(1),
            "job10_ours": head.job10_ours.name,
            "job10_peer": head.job10_peer.name,
            "job10_ratio": head.job10_ratio,
            "job10_ratio_rounds": head.job_rounds(10),
            "grouped_peer": head.grouped.name if head.grouped else None,
            "ceiling": head.ceiling,
            "ratio_to_grouped_rounds": head.speed_rounds(head.grouped) if head.grouped else [],
        }
    return {
        "config": config,
        "headline": headline_,
        "results": [asdict(r) for r in results],
    }

"""The benchmark's results: the loss-agreement check, the table and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .harness import COMPILED_BASELINES, SAME_BATCHES, StrategyResult

__all__ = ["check_losses", "format_table", "plot"]


def check_losses(
    results: Sequence[StrategyResult], rtol: float = 2e-3, atol: float = 2e-3
) -> list[str]:
    """Compare the per-step losses of the strategies that saw the same batches.

    Returns one line per disagreement (empty when all agree): padding with a
    correct mask must not change the math.
    """
    same = [r for r in results if r.name in SAME_BATCHES and r.error is None and r.losses]
    if len(same) < 2:
        return []
    ref = same[0]
    problems = []
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


def _best_baseline(results: Sequence[StrategyResult]) -> StrategyResult | None:
    ok = [r for r in results if r.name in COMPILED_BASELINES and r.error is None]
    return max(ok, key=lambda r: r.useful_tokens_per_sec) if ok else None


def format_table(results: Sequence[StrategyResult]) -> str:
    best = _best_baseline(results)
    ranked = sorted(results, key=lambda r: -r.useful_tokens_per_sec if r.error is None else 0)
    head = (
        f"{'strategy':<19s} {'useful tok/s':>12s} {'vs best':>7s} {'steps/s':>8s} {'warmup s':>8s} "
        f"{'graphs':>6s} {'timed recompiles':>16s} {'limit hit':>9s} {'tok eff':>7s} {'peak MB':>8s} {'loss':>7s}"
    )
    lines = [head, "-" * len(head)]
    for r in ranked:
        if r.error is not None:
            lines.append(f"{r.name:<19s} failed: {r.error}")
            continue
        ratio = (
            f"{r.useful_tokens_per_sec / best.useful_tokens_per_sec:6.2f}x" if best else "    -  "
        )
        lines.append(
            f"{r.name:<19s} {r.useful_tokens_per_sec:>12,.0f} {ratio:>7s} {r.steps_per_sec:>8.2f} {r.warmup_s:>8.1f} "
            f"{r.graphs:>6d} {r.timed_recompiles:>16d} {'yes' if r.recompile_limit_hit else 'no':>9s} "
            f"{r.token_efficiency:>7.1%} {r.peak_mem_mb:>8.0f} {r.final_loss:>7.3f}"
        )
    if best is not None:
        lines.append(
            f"'vs best': useful tokens/sec relative to the best compiled strategy without shapebucket ({best.name})"
        )
    return "\n".join(lines)


def plot(results: Sequence[StrategyResult], path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.error is None]
    names = [r.name for r in ok]
    colors = [
        "#55a868"
        if n.startswith("shapebucket")
        else ("#4c72b0" if n in COMPILED_BASELINES else "#8c8c8c")
        for n in names
    ]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.barh(names, [r.useful_tokens_per_sec for r in ok], color=colors)
    a.set_xlabel("useful (real) tokens / s, higher is better")
    a.invert_yaxis()
    b.barh(names, [r.warmup_s for r in ok], color=colors)
    b.set_xlabel("warm-up seconds (compile + prewarm), lower is better")
    b.invert_yaxis()
    b.set_yticklabels([])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)



"""Two-length buckets against one-length buckets and lhotse/NeMo-style 2-D bins.

Real-token share (real source + target tokens over padded source + target
tokens, every sample padded to its cell, rows not padded) at the same number of
compiled shapes K, on two synthetic length distributions (200,000 samples each,
fixed seeds):

* translation-like: source tokens lognormal (median 22, sigma 0.6, 1..256), the
  target the source times a lognormal ratio (median 1.1, sigma 0.25), 1..256;
* speech-like: durations lognormal (median 12 s, sigma 0.5, 1..30 s), the source
  100 frames per second (10 ms hop), the target 3 tokens per second times a
  lognormal rate (sigma 0.3) plus 1.

Methods, every length aligned to 8:

* ``1-D source``: ``fit_buckets(sources, K)``; each bucket's target padded to the
  longest target in the bucket (the one fixed target a one-length table can give a
  bucket without cutting);
* ``1-D target``: the same with the roles swapped;
* ``NeMo 2-D a x b``: ``a`` source bins of equal total source (NeMo's
  ``estimate_duration_bins_2d``, itself lhotse's equal-duration bins), then ``b``
  target sub-bins of equal total target inside each, bin edges the longest of each
  bin; the best ``a x b = K`` is reported (without NeMo's outlier filter, which
  drops samples);
* ``fit_cells``: :func:`shapebucket.fit.cell_fit.fit_cells` (hierarchical, exact on its grid);
* ``bound``: no table of K cells can beat it (:func:`cells_lower_bound`).

``source`` and ``target`` are each side's own real-token share. A third run
weighs a target token as 8 source frames (an encoder that subsamples frames 8x,
as FastConformer does, against a decoder token): the share is then
``(s + 8 t) / (S + 8 T)``, every table is scored with that edge rule, and
``fit_cells`` and the bound use ``weights=(1, 8)``.

Every table is scored with the same edge rule (each sample in its cheapest cell).

    python benchmarks/two_length.py [--n 200000] [--k 4 8 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from shapebucket import fit_buckets
from shapebucket._lengths import round_up
from shapebucket.fit import cells_report
from shapebucket.fit.cell_fit import cells_lower_bound, fit_cells
from shapebucket.fit.cells import Cells

ALIGN = 8


def translation(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = np.clip(np.round(rng.lognormal(np.log(22), 0.6, n)), 1, 256).astype(np.int64)
    ratio = rng.lognormal(np.log(1.1), 0.25, n)
    tgt = np.clip(np.round(src * ratio), 1, 256).astype(np.int64)
    return src, tgt


def speech(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    seconds = np.clip(rng.lognormal(np.log(12), 0.5, n), 1, 30)
    frames = np.round(seconds * 100).astype(np.int64)
    tokens = np.round(seconds * 3 * rng.lognormal(0, 0.3, n)).astype(np.int64) + 1
    return frames, tokens


def one_length(first: np.ndarray, second: np.ndarray, k: int, swap: bool) -> Cells:
    buckets = fit_buckets(first, k, align=ALIGN)
    index = buckets.index_for_many(first)
    cells = []
    for j, b in enumerate(buckets):
        members = second[index == j]
        if members.size:
            other = max(round_up(int(members.max()), ALIGN), ALIGN)
            cells.append((other, b) if swap else (b, other))
    return Cells(cells)


def _equal_total_edges(values: np.ndarray, bins: int) -> list[int]:
    """The longest value of each of ``bins`` groups of (about) equal total, sorted."""
    ordered = np.sort(values)
    cum = np.cumsum(ordered)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, bins) / bins, side="left")
    return sorted({int(ordered[i]) for i in cuts} | {int(ordered[-1])})


def nemo_2d(src: np.ndarray, tgt: np.ndarray, a: int, b: int) -> Cells:
    cells = set()
    edges = [round_up(e, ALIGN) for e in _equal_total_edges(src, a)]
    lo = 0
    for hi in sorted(set(edges)):
        members = (round_up(src, ALIGN) > lo) & (round_up(src, ALIGN) <= hi)
        if members.any():
            for e in _equal_total_edges(tgt[members], b):
                cells.add((hi, max(round_up(e, ALIGN), ALIGN)))
        lo = hi
    return Cells(cells)


Row = tuple[str, float, float, float, int]


def share(
    cells: Cells, src: np.ndarray, tgt: np.ndarray, w: tuple[int, int] = (1, 1)
) -> tuple[float, float, float, int]:
    """(share, source share, target share, cells used), each sample in its cheapest cell
    under the weights ``w``; the share is weighted by ``w`` too."""
    r = cells_report(Cells(cells, weights=w), src, tgt)
    real = w[0] * src.sum() + w[1] * tgt.sum()
    padded = w[0] * src.sum() / r.source_efficiency + w[1] * tgt.sum() / r.target_efficiency
    return float(real / padded), r.source_efficiency, r.target_efficiency, r.num_shapes


def rows_for(src: np.ndarray, tgt: np.ndarray, k: int, w: tuple[int, int] = (1, 1)) -> list[Row]:
    out = []
    for label, swap in (("1-D source", False), ("1-D target", True)):
        first, second = (tgt, src) if swap else (src, tgt)
        out.append((label, *share(one_length(first, second, k, swap), src, tgt, w)))
    best = max(
        ((a, k // a, *share(nemo_2d(src, tgt, a, k // a), src, tgt, w)) for a in range(1, k + 1)),
        key=lambda r: r[2] if r[5] <= k else -1,
    )
    out.append((f"NeMo 2-D {best[0]} x {best[1]}", *best[2:]))
    fitted = fit_cells(src, tgt, k, align=ALIGN, weights=w)
    out.append(("fit_cells", *share(fitted, src, tgt, w)))
    real = w[0] * src.sum() + w[1] * tgt.sum()
    bound = real / cells_lower_bound(src, tgt, k, align=ALIGN, weights=w)
    out.append(("bound (no K cells beat it)", float(bound), float("nan"), float("nan"), k))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--k", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = [
        ("translation-like", translation, (1, 1)),
        ("speech-like", speech, (1, 1)),
        ("speech-like, a target token weighs 8 frames", speech, (1, 8)),
    ]
    for name, make, w in runs:
        src, tgt = make(args.n)
        print(f"\n### {name}: {args.n:,} samples, weights {w}")
        print(
            f"source median {int(np.median(src))} (max {src.max()}), "
            f"target median {int(np.median(tgt))} (max {tgt.max()})\n"
        )
        print("| K | method | real-token share | source | target | shapes used |")
        print("|---|---|---|---|---|---|")
        for k in args.k:
            for label, eff, s_eff, t_eff, used in rows_for(src, tgt, k, w):
                print(f"| {k} | {label} | {eff:.3f} | {s_eff:.3f} | {t_eff:.3f} | {used} |")
        for k in args.k:
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fit_cells(src, tgt, k, align=ALIGN, weights=w)
                times.append(time.perf_counter() - t0)
            print(
                f"\nfit_cells k={k}: median {np.median(times):.2f} s "
                f"(min {min(times):.2f}, max {max(times):.2f}, {args.repeats} runs)"
            )


if __name__ == "__main__":
    main()

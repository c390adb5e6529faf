"""Command line: ``python -m shapebucket {suggest,bench,demo}``.

* ``suggest LENGTHS_FILE``: compare bucket policies on your lengths and print the
  ``Buckets(...)`` line to paste; with ``--k auto`` and the job, choose the number of
  buckets first.
* ``bench``: the steps/sec benchmark (``benchmarks/steps_per_sec.py``).
* ``demo``: ``suggest`` on the built-in length mixture.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._argparse import (
    MAX_DRAWN,
    Parser,
    output_path,
    plot_formats,
    positive_float,
    positive_int,
    pyplot,
)
from ._validate import check_int
from .advise.kchoice import choose_k
from .advise.policies import compare_policies
from .data import mixture_lengths, read_lengths
from .errors import ShapeBucketError
from .fit.optimal import DEFAULT_ALIGN

__all__ = ["main"]


def _plot_lengths(
    lengths: np.ndarray, boundaries: Iterable[int], path: str | Path, title: str
) -> None:
    """A histogram of ``lengths`` with the bucket boundaries drawn on it, written to ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    lo, hi = int(lengths.min()), int(lengths.max())
    # one bin per length when that is readable, else 200 even bins
    bins: Any = np.arange(lo, hi + 2) - 0.5 if hi - lo < 1000 else 200
    ax.hist(lengths, bins=bins, color="#4c72b0")
    for b in boundaries:
        ax.axvline(b, color="#c44e52", linewidth=1)
    ax.set_xlabel("sample length (red: bucket boundaries)")
    ax.set_ylabel("samples")
    ax.set_yscale("log")
    ax.set_title(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise ShapeBucketError(f"--plot {path}: cannot write it ({e})") from None
    finally:
        plt.close(fig)


def _given(args: argparse.Namespace, flags: Sequence[str]) -> list[str]:
    """The ``flags`` passed on the command line (each one's dest is not None)."""
    return [f for f in flags if getattr(args, f[2:].replace("-", "_")) is not None]


def _choose_k(args: argparse.Namespace, lengths: np.ndarray) -> int:
    """``--k auto``: print the K table and its notes, return the chosen K."""
    missing = [f for f in _K_AUTO[:3] if f not in _given(args, _K_AUTO)]
    if missing:
        raise ShapeBucketError(
            "--k auto needs --compile-seconds (one bucket's compile), --job-samples (samples "
            f"to train on) and --tokens-per-second (computed tokens/s of the step); missing: "
            f"{', '.join(missing)}"
        )
    choice = choose_k(
        lengths,
        compile_seconds=args.compile_seconds,
        job_samples=args.job_samples,
        tokens_per_second=args.tokens_per_second,
        max_k=32 if args.max_k is None else args.max_k,
        align=args.align,
        batch_size=args.batch_size,
        batching=args.batching,
    )
    print(choice)
    print()
    return choice.chosen.k


def _suggest(args: argparse.Namespace, lengths: np.ndarray | None = None) -> int:
    given = _given(args, _K_AUTO)
    if args.k != "auto" and given:
        verb, pronoun = ("describes", "it") if len(given) == 1 else ("describe", "they")
        raise ShapeBucketError(
            f"{' and '.join(given)} {verb} the job for --k auto; with a fixed number of "
            f"buckets (--k {args.k}; 8 unless given) {pronoun} would be ignored: pass --k auto, "
            "or leave them out"
        )
    plot = None if args.plot is None else output_path("--plot", args.plot, formats=plot_formats())
    if lengths is None:
        lengths = read_lengths(args.lengths_file)
    k = _choose_k(args, lengths) if args.k == "auto" else args.k
    table = compare_policies(
        lengths, k, align=args.align, batch_size=args.batch_size, batching=args.batching
    )
    print(table)
    print()
    print("Suggested (paste into your code):")
    print(f"    buckets = shapebucket.fit.{table.fitted!r}")
    if plot is not None:
        _plot_lengths(lengths, table.fitted, plot, f"fitted buckets (k={k}, align={args.align})")
        print(f"wrote {plot}")
    return 0


def _k_value(text: str) -> int | str:
    return text if text == "auto" else int(text)


_k_value.__name__ = "int or 'auto'"  # argparse names the type in its error


def _demo(args: argparse.Namespace) -> int:
    n = check_int("--samples", args.samples, minimum=1, maximum=MAX_DRAWN)
    return _suggest(args, mixture_lengths(n, seed=0))


# the optional flags without a default, in --help's order: (flag, type, help)
_K_AUTO_FLAGS: list[tuple[str, Callable[[str], Any], str]] = [
    ("--compile-seconds", positive_float, "--k auto: one bucket's compile"),
    ("--job-samples", positive_int, "--k auto: samples the job trains on"),
    ("--tokens-per-second", positive_float, "--k auto: computed tokens/s of the step"),
    ("--max-k", positive_int, "--k auto: the largest K tried (default 32)"),
]
#: the flags of ``--k auto`` (the first three required)
_K_AUTO = [flag for flag, _, _ in _K_AUTO_FLAGS]


def _fit_flags(p: argparse.ArgumentParser) -> None:
    """The flags of fitting buckets that ``suggest`` and ``demo`` share."""
    p.add_argument(
        "--k",
        type=_k_value,
        default=8,
        help="number of buckets (default 8, the recompile limit), or 'auto' to choose it "
        "from the job (with --compile-seconds, --job-samples, --tokens-per-second)",
    )
    for flag, kind, text in _K_AUTO_FLAGS:
        p.add_argument(flag, type=kind, help=text)
    p.add_argument(
        "--align",
        type=int,
        default=DEFAULT_ALIGN,
        help=f"buckets are multiples of this (default {DEFAULT_ALIGN})",
    )
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument(
        "--batching",
        choices=["bucketed", "random"],
        default="bucketed",
        help="how batches are formed: inside buckets (BucketBatchSampler) or at random",
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="write a histogram with the boundaries (.png, .pdf, .svg, ...; no extension: .png)",
    )


def _parser() -> Parser:
    """The command line: ``suggest``, ``demo`` and ``bench`` (which parses its own flags)."""
    parser = Parser(
        prog="python -m shapebucket",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    suggest = sub.add_parser("suggest", help="fit buckets to a lengths file and compare policies")
    suggest.add_argument("lengths_file", help="one int per line, or a .npy array")
    _fit_flags(suggest)
    suggest.set_defaults(func=_suggest)
    demo = sub.add_parser("demo", help="suggest on the built-in length mixture")
    demo.add_argument("--samples", type=int, default=200_000, help="lengths drawn from the mixture")
    _fit_flags(demo)
    demo.set_defaults(func=_demo)
    sub.add_parser("bench", help="the steps/sec benchmark; see 'bench --help'", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ShapeBucketError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

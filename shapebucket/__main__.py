"""Command line: ``python -m shapebucket {demo,suggest,bench}``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .buckets import Buckets
from .data import mixture_lengths


def _demo(args: argparse.Namespace) -> int:
    lengths = mixture_lengths(args.n, seed=0)
    for name, buckets in [
        ("multiples of 32", Buckets.multiples(32, int(lengths.max()))),
        ("powers of two", Buckets.powers_of_two(int(lengths.max()))),
    ]:
        b = buckets.bucket_for_many(lengths)
        print(f"{name:16s} {buckets!r}: token efficiency {lengths.sum() / b.sum():.1%}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shapebucket", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="print bucket tables for the built-in length mixture")
    demo.add_argument("--n", type=int, default=100_000)
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

"""The command line's argument parser and output checks: a usage mistake is one
``error:`` line and exit 2, and every file a subcommand writes is checked before any
work starts (:func:`output_path`)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any, NoReturn

from .errors import ShapeBucketError

#: The most lengths ``--samples`` draws (demo, bench): 100 million int64 lengths are
#: 800 MB, and drawing them takes a few GB; more ran out of memory with a traceback.
MAX_DRAWN = 100_000_000

__all__ = [
    "MAX_DRAWN",
    "Parser",
    "output_path",
    "plot_formats",
    "positive_float",
    "positive_int",
    "pyplot",
]


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (the error names the flag, as argparse does)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


positive_int.__name__ = "int >= 1"
positive_float.__name__ = "number > 0"


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr, ``error: ...``,
    pointing at ``--help`` instead of printing the usage block; the exit status stays 2.
    Subcommand parsers made with ``add_subparsers`` are of this class too."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def output_path(
    flag: str,
    value: str | Path,
    *,
    formats: Collection[str] | None = None,
    make_dirs: bool = False,
) -> Path:
    """Where ``flag`` writes, checked before any work: a file name (not a directory),
    in a directory that exists (or, with ``make_dirs``, can be made: no part of the path
    is a regular file) and can be written; with ``formats`` (extensions without the dot,
    e.g. :func:`plot_formats`) a name without an extension gets ``.png`` and the extension
    must be one of them.

    >>> output_path("--json", "results.json")
    PosixPath('results.json')
    """
    text = str(value)
    path = Path(text)
    if not path.name or path.name in (".", "..") or text.endswith(("/", "\\")) or path.is_dir():
        raise ShapeBucketError(
            f"{flag} {text!r} is not a file name; pass e.g. "
            f"{str(path / ('out.png' if formats is not None else 'out.json'))!r}"
        )
    if formats is not None:
        if not path.suffix:
            path = path.with_name(path.name + ".png")
        if path.suffix[1:].lower() not in formats:
            raise ShapeBucketError(
                f"{flag} {text}: matplotlib cannot write {path.suffix!r} files; use one of "
                f"{', '.join('.' + f for f in sorted(formats))} (e.g. {path.stem}.png)"
            )
    parent = path.absolute().parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir():
        raise ShapeBucketError(
            f"{flag} {text}: {str(existing)!r} is a file, not a directory; pass a path "
            "inside a directory"
        )
    if existing != parent and not make_dirs:
        raise ShapeBucketError(
            f"{flag} {text}: directory {str(path.parent)!r} does not exist; create it first"
        )
    if not os.access(existing, os.W_OK):
        raise ShapeBucketError(f"{flag} {text}: directory {str(existing)!r} is not writable")
    return path


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or a :class:`ShapeBucketError` naming the
    extra that installs it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the environment
        raise ShapeBucketError(
            "--plot needs matplotlib: pip install 'shapebucket[bench]'"
        ) from None
    return plt


def plot_formats() -> set[str]:
    """The file extensions (without the dot) matplotlib writes here."""
    plt = pyplot()
    fig = plt.figure()
    try:
        return set(fig.canvas.get_supported_filetypes())
    finally:
        plt.close(fig)

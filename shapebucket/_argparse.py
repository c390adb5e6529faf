"""The command line's argument parser: a usage mistake is one ``error:`` line and exit 2."""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

__all__ = ["Parser", "non_negative_float", "positive_float", "positive_int"]


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (the error names the flag, as argparse does)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


positive_int.__name__ = "int >= 1"
positive_float.__name__ = "number > 0"
non_negative_float.__name__ = "number >= 0"


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr, ``error: ...``,
    pointing at ``--help`` instead of printing the usage block; the exit status stays 2.
    Subcommand parsers made with ``add_subparsers`` are of this class too."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

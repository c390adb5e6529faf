"""The command line's argument parser: a usage mistake is one ``error:`` line and exit 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["Parser"]


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr, ``error: ...``,
    pointing at ``--help`` instead of printing the usage block; the exit status stays 2.
    Subcommand parsers made with ``add_subparsers`` are of this class too."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

"""Lengths in and out: the built-in length mixture, and reading a lengths file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._lengths import check_lengths
from .errors import ShapeBucketError

__all__ = ["mixture_lengths", "read_lengths"]


def mixture_lengths(n: int, seed: int = 0) -> np.ndarray:
    """The project's reference mixture: ``L + 1`` with ``L`` drawn 90% uniform in
    [5, 31], 9% in [33, 63] and 1% in [65, 255] (so lengths span 6..256).

    >>> mixture_lengths(5, seed=0).shape
    (5,)
    """
    rng = np.random.default_rng(seed)
    part = rng.choice(3, size=n, p=[0.90, 0.09, 0.01])
    lo = np.array([5, 33, 65])[part]
    hi = np.array([31, 63, 255])[part]
    return (rng.integers(lo, hi + 1) + 1).astype(np.int64)


def read_lengths(path: str | Path) -> np.ndarray:
    r"""Lengths from a ``.npy`` file (a 1-D integer array) or a text file with one int per
    line, checked like every other lengths input (1-D ints >= 1).

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = os.path.join(tmp, "lengths.txt")
    ...     _ = open(path, "w").write("3\n5\n9\n")
    ...     read_lengths(path).tolist()
    [3, 5, 9]
    """
    path = Path(path)
    if not path.exists():
        raise ShapeBucketError(f"lengths file {str(path)!r} does not exist")
    if not path.is_file():
        raise ShapeBucketError(
            f"lengths file {str(path)!r} is not a file; pass a .npy file or a text file with one int per line"
        )
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise ShapeBucketError(
                f"{path}: not a readable .npy integer array ({e}); save lengths with np.save(path, np.asarray(lengths, dtype=np.int64))"
            ) from None
        return check_lengths(arr, name=f"lengths in {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ShapeBucketError(
            f"{path}: not a text file (it does not decode as UTF-8); pass one int per line, or a .npy file"
        ) from None
    values = []
    for lineno, line in enumerate(lines, 1):
        word = line.strip()
        if not word:
            continue  # blank lines (a trailing newline, a gap) carry no sample
        if not (word.isascii() and word.isdigit()):
            raise ShapeBucketError(
                f"{path}, line {lineno}: {word!r} is not an int >= 1; the file needs one sample "
                "length per line"
            )
        values.append(int(word))
    if not values:
        raise ShapeBucketError(f"{path} is empty; it needs one sample length per line")
    return check_lengths(values, name=f"lengths in {path}")

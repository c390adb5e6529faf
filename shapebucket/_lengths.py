"""A dataset's lengths, checked once at the public edge (:func:`check_lengths`, passed on
as :class:`CheckedLengths`), and a length's limits and rounding."""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence, Set
from typing import Any, TypeVar

import numpy as np

from .errors import ShapeBucketError

__all__ = ["MAX_BUCKET", "MAX_LENGTH", "MIN_LENGTH", "CheckedLengths", "check_lengths", "round_up"]

#: The smallest sample length a dataset may hold. An empty sample is almost
#: always a data bug (a failed read, an empty line), so every entry point that
#: takes a dataset's lengths refuses it rather than planning a batch for it.
MIN_LENGTH = 1

#: The longest sample accepted: 2**30 tokens. No sequence model takes more in one
#: row (one such row of int64 ids is 8 GiB), and a larger value almost always comes
#: from a bad length computation (a byte count, an overflow).
MAX_LENGTH = 2**30
#: The longest bucket: room to round the longest sample up (to a power of two, or a
#: multiple of any alignment up to MAX_LENGTH).
MAX_BUCKET = 2**31

_INT64_MAX = np.iinfo(np.int64).max

T = TypeVar("T", int, np.ndarray)


class CheckedLengths(Sequence[int]):
    """Lengths that passed :func:`check_lengths` once: :func:`check_lengths` returns its
    ``array`` (a read-only private copy) at once instead of checking every sample again.

    >>> checked = CheckedLengths.of([3, 5, 9])
    >>> check_lengths(checked) is checked.array, len(checked), checked[1]
    (True, 3, 5)
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @classmethod
    def of(cls, lengths: Any) -> CheckedLengths:
        """``lengths`` checked by :func:`check_lengths` (ints >= 1, not empty)."""
        if isinstance(lengths, CheckedLengths):
            return lengths
        array = np.array(check_lengths(lengths), dtype=np.int64)
        array.flags.writeable = False
        return cls(array)

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: Any) -> Any:
        value = self.array[i]
        return int(value) if np.ndim(value) == 0 else value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.array if dtype is None else self.array.astype(dtype)

    def __repr__(self) -> str:
        return f"CheckedLengths({self.array!r})"


def check_lengths(
    lengths: Any, *, name: str = "lengths", minimum: int = MIN_LENGTH, allow_empty: bool = False
) -> np.ndarray:
    """``lengths`` as a 1-D int64 array, or a :class:`ShapeBucketError` that says what is wrong and how to fix it.

    Accepted: a list, tuple or range of ints, a 1-D numpy integer array, a 1-D
    integer tensor, a :class:`CheckedLengths` (returned as it is). Refused, each with
    its own message: generators and sets (no length, no order), 0-D and N-D arrays,
    floats (also integral ones), bools (also among the ints of a list, naming the
    sample), object arrays (mixed types, or ints too large for int64), values below
    ``minimum`` and values that do not fit in int64.

    >>> check_lengths([3, 5, 9])
    array([3, 5, 9])
    >>> check_lengths([3.0, 5.0])
    Traceback (most recent call last):
    ...
    shapebucket.errors.ShapeBucketError: lengths must be integers, got dtype float64 (index 0 is 3.0); convert with np.asarray(lengths).astype(np.int64) if the values are whole numbers
    """
    if isinstance(lengths, CheckedLengths) and minimum <= MIN_LENGTH:
        return lengths.array
    arr = _as_array(lengths, name)
    if arr.size == 0:
        if allow_empty:
            return arr.astype(np.int64)
        raise ShapeBucketError(f"{name} is empty; pass at least one sample length")
    arr = _as_int64(arr, name)
    hi = int(arr.max())
    if hi > MAX_LENGTH:
        i = int(np.argmax(arr > MAX_LENGTH))
        raise ShapeBucketError(
            f"sample {i} has length {hi} > {MAX_LENGTH} (2**30), the longest shapebucket "
            f"accepts; no model takes such a row: check how {name} were computed (bytes instead "
            "of tokens? an overflow?)"
        )
    lo = int(arr.min())
    if lo < minimum:
        i = int(np.argmax(arr < minimum))
        raise ShapeBucketError(
            f"sample {i} has length {lo}; {name} must be >= {minimum}"
            + (" (filter out empty samples first)" if minimum == 1 else "")
        )
    return arr


def _as_array(lengths: Any, name: str) -> np.ndarray:
    """``lengths`` as a 1-D numpy array of any dtype: the container checks."""
    if isinstance(lengths, (Iterator, Set, dict)) or (
        not hasattr(lengths, "__len__") and not hasattr(lengths, "__array__")
    ):
        raise ShapeBucketError(
            f"{name} must be a list, tuple or 1-D array of ints, got {type(lengths).__name__}; "
            f"pass list({name}) for a generator or iterator, sorted({name}) for a set"
        )
    if isinstance(lengths, (str, bytes)):
        raise ShapeBucketError(f"{name} must be a list or array of ints, got a string")
    # numpy would read True as 1 among ints
    if isinstance(lengths, (list, tuple)) and {bool, np.bool_} & set(map(type, lengths)):
        i = next(i for i, v in enumerate(lengths) if isinstance(v, (bool, np.bool_)))
        raise ShapeBucketError(
            f"sample {i} has length {lengths[i]!r}, a bool; {name} must be ints (a bool "
            "is not a length: check how they were computed)"
        )
    try:
        arr = np.asarray(lengths)
    except (ValueError, TypeError) as e:
        raise ShapeBucketError(f"{name} cannot be read as an array of ints: {e}") from None
    if arr.ndim != 1:
        raise ShapeBucketError(
            f"{name} must be 1-D (one length per sample), got shape {arr.shape}; "
            f"pass np.ravel({name}) if flattening is what you mean"
        )
    return arr


def _too_large(name: str, i: int, value: int) -> ShapeBucketError:
    return ShapeBucketError(
        f"{name}[{i}] is {value}, which does not fit in int64 (max {_INT64_MAX}); "
        "no real sample is that long: check how the lengths were computed"
    )


def _as_int64(arr: np.ndarray, name: str) -> np.ndarray:
    """A non-empty 1-D array as int64: the dtype checks."""
    if arr.dtype == object:
        for i, v in enumerate(arr.tolist()):
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise ShapeBucketError(
                    f"{name} must be integers; index {i} is {v!r} ({type(v).__name__})"
                )
            if not -_INT64_MAX - 1 <= int(v) <= _INT64_MAX:
                raise _too_large(name, i, int(v))
        arr = arr.astype(np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        hint = (
            "; convert with np.asarray(lengths).astype(np.int64) if the values are whole numbers"
            if arr.dtype.kind == "f"
            else ""
        )
        raise ShapeBucketError(
            f"{name} must be integers, got dtype {arr.dtype} (index 0 is {arr[0].item()!r}){hint}"
        )
    if arr.dtype == np.uint64 and int(arr.max()) > _INT64_MAX:
        i = int(np.argmax(arr > _INT64_MAX))
        raise _too_large(name, i, int(arr[i]))
    return arr.astype(np.int64, copy=False)


def round_up(value: T, multiple: int) -> T:
    """``value`` rounded up to a multiple of ``multiple`` (an int, or elementwise on an int array).

    >>> round_up(13, 8), round_up(np.array([1, 8, 9]), 8).tolist()
    (16, [8, 8, 16])
    """
    return -(-value // multiple) * multiple

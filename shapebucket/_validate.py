"""The one validation path for user input: lengths arrays, ints, numbers and flags.

Every public entry point that takes a dataset's lengths (``fit_buckets``,
``padding_report``, ``compare_policies``, ``BucketBatchSampler``, the CLI) calls
:func:`check_lengths`, every int argument goes through :func:`check_int`, every real
number through :func:`check_number` and every flag through :func:`check_flag`, so the
same input gets the same answer everywhere. Lengths are checked once at the public
edge: an entry point that passes them on hands over a :class:`CheckedLengths`, which
:func:`check_lengths` returns without checking again. Also home of the two small
numeric helpers that more than one module needs: :func:`round_up` and
:func:`batch_max_distribution`.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any, TypeVar

import numpy as np

from .errors import ShapeBucketError

__all__ = [
    "MAX_BUCKET",
    "MAX_LENGTH",
    "MIN_LENGTH",
    "CheckedLengths",
    "batch_max_distribution",
    "check_batch_sizes",
    "check_fits_in_memory",
    "check_flag",
    "check_int",
    "check_lengths",
    "check_number",
    "check_row_buckets",
    "physical_memory",
    "round_up",
]

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


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool, or a :class:`ShapeBucketError` naming ``name``: a string such
    as ``"no"`` is true in Python and would silently mean the opposite.

    >>> check_flag("drop_last", False)
    False
    >>> check_flag("drop_last", "no")
    Traceback (most recent call last):
    ...
    shapebucket.errors.ShapeBucketError: drop_last must be True or False, got 'no' (str)
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ShapeBucketError(
            f"{name} must be True or False, got {value!r} ({type(value).__name__})"
        )
    return bool(value)


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as a Python int, or a :class:`ShapeBucketError` naming ``name``, the value and the bound.

    Accepts Python and numpy integers; refuses bools, floats (also integral
    ones: ``2.0`` is most often a computation that went wrong) and strings.

    >>> check_int("k", 8, minimum=1)
    8
    >>> check_int("k", 0, minimum=1)
    Traceback (most recent call last):
    ...
    shapebucket.errors.ShapeBucketError: k must be >= 1, got 0
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ShapeBucketError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ShapeBucketError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ShapeBucketError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
    hint: str = "",
) -> float:
    """``value`` as a finite float within the bounds (``> above``, ``>= at_least``,
    ``< below``, ``<= at_most``), or a :class:`ShapeBucketError` naming ``name``, the value,
    the bound and ``hint`` (the fix). Refuses bools and strings: ``"0.1"`` is a typo, not
    a number.

    >>> check_number("contention", 1.5, at_least=1)
    1.5
    >>> check_number("tolerance", 1.0, at_least=0, below=1)
    Traceback (most recent call last):
    ...
    shapebucket.errors.ShapeBucketError: tolerance must be a finite number in [0, 1), got 1.0
    >>> check_number("share", 0, above=0, at_most=1, hint="; pass a share of the whole")
    Traceback (most recent call last):
    ...
    shapebucket.errors.ShapeBucketError: share must be a finite number in (0, 1], got 0; pass a share of the whole
    """
    bound = _bound(above, at_least, below, at_most)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ShapeBucketError(
            f"{name} must be a number {bound}, got {value!r} ({type(value).__name__}){hint}"
        )
    number = float(value)
    if not (
        math.isfinite(number)
        and (above is None or number > above)
        and (at_least is None or number >= at_least)
        and (below is None or number < below)
        and (at_most is None or number <= at_most)
    ):
        raise ShapeBucketError(f"{name} must be a finite number {bound}, got {value!r}{hint}")
    return number


def _bound(
    above: float | None, at_least: float | None, below: float | None, at_most: float | None
) -> str:
    """The bounds in words: an interval (``in [0, 1)``) when both ends are given."""
    low = f"({above:g}" if above is not None else f"[{at_least:g}" if at_least is not None else ""
    high = f"{below:g})" if below is not None else f"{at_most:g}]" if at_most is not None else ""
    if low and high:
        return f"in {low}, {high}"
    parts = [f"> {above:g}"] if above is not None else []
    parts += [f">= {at_least:g}"] if at_least is not None else []
    parts += [f"< {below:g}"] if below is not None else []
    parts += [f"<= {at_most:g}"] if at_most is not None else []
    return " and ".join(parts)


class CheckedLengths(Sequence[int]):
    """Lengths that passed :func:`check_lengths` once, passed on checked: handing it to
    :func:`check_lengths` again (any entry point that takes lengths) returns its array at
    once instead of checking every sample again. Its ``array`` is a read-only private
    copy, so nothing can change it after the check.

    >>> checked = CheckedLengths.of([3, 5, 9])
    >>> check_lengths(checked) is checked.array, len(checked), checked[1]
    (True, 3, 5)
    """

    __slots__ = ("array", "minimum")

    def __init__(self, array: np.ndarray, minimum: int) -> None:
        self.array = array
        self.minimum = minimum

    @classmethod
    def of(cls, lengths: Any, *, name: str = "lengths") -> CheckedLengths:
        """``lengths`` checked by :func:`check_lengths` (ints >= 1, not empty)."""
        if isinstance(lengths, CheckedLengths):
            return lengths
        array = np.array(check_lengths(lengths, name=name), dtype=np.int64)
        array.flags.writeable = False
        return cls(array, MIN_LENGTH)

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
    if isinstance(lengths, CheckedLengths) and lengths.minimum >= minimum:
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


def check_batch_sizes(
    value: Any, buckets: Iterable[int], name: str = "rows"
) -> int | dict[int, int] | None:
    """Rows per bucket, checked: ``None``, an int >= 1, or a mapping with an int >= 1 for every bucket.

    >>> check_batch_sizes({8: 4, 16: 2}, [8, 16])
    {8: 4, 16: 2}
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        rows = {}
        for b, n in value.items():
            rows[check_int(f"{name} key", b, minimum=1)] = check_int(f"{name}[{b}]", n, minimum=1)
        missing = [b for b in buckets if b not in rows]
        if missing:
            raise ShapeBucketError(
                f"{name} has no batch size for buckets {missing}; give one for every bucket "
                f"{list(buckets)} (BucketBatchSampler.rows has them all)"
            )
        extra = sorted(set(rows) - set(buckets))
        if extra:  # a typo'd bucket, or a sampler with other buckets: never silently unused
            raise ShapeBucketError(
                f"{name} names {extra}, which are not buckets of {list(buckets)}; give rows for "
                "exactly those buckets (pass the sampler's rows, built from the same buckets)"
            )
        return rows
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ShapeBucketError(
            f"{name} must be an int >= 1 or a mapping bucket -> rows, got {value!r}"
        )
    return check_int(name, value, minimum=1)


def round_up(value: T, multiple: int) -> T:
    """``value`` rounded up to a multiple of ``multiple`` (an int, or elementwise on an int array).

    >>> round_up(13, 8), round_up(np.array([1, 8, 9]), 8).tolist()
    (16, [8, 8, 16])
    """
    return -(-value // multiple) * multiple


def batch_max_distribution(counts: np.ndarray, batch_size: int) -> np.ndarray:
    """The probability that a random batch's longest sample falls in each group.

    ``counts`` are the samples per group (groups ordered by length). A batch of
    ``batch_size`` samples drawn with replacement has its maximum at or below
    group ``j`` with probability ``F(j) ** batch_size``, ``F`` the cumulative
    share, so group ``j`` holds the maximum with ``F(j)**B - F(j-1)**B``.

    >>> batch_max_distribution(np.array([1.0, 1.0]), 2).tolist()
    [0.25, 0.75]
    """
    cdf = np.cumsum(counts, dtype=np.float64) / float(np.sum(counts))
    cdf[-1] = 1.0
    return np.diff(cdf**batch_size, prepend=0.0)


def physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not on this platform
        return None


def check_fits_in_memory(rows: int, bucket: int, n_keys: int, buckets: Any) -> None:
    """Refuse a batch that cannot fit in this machine's memory before allocating it: with
    memory overcommit, a too-large allocation succeeds and the process is killed later."""
    need = rows * bucket * (8 * n_keys + 2) + 16 * bucket  # 8-byte values, masks, positions
    if need < 2**30:  # every machine that runs a model has a GiB: skip asking the OS
        return
    total = physical_memory()
    if total is not None and need > total:
        raise ShapeBucketError(
            f"a batch of {rows} rows at bucket {bucket} needs about {need / 2**30:.1f} GiB, more "
            f"than this machine's {total / 2**30:.1f} GiB of memory; check the bucket table "
            f"{buckets!r} and the batch size"
        )


def check_row_buckets(row_buckets: Any) -> list[int]:
    """``row_buckets`` (a list of ints >= 1, a 1-D array) as sorted unique ints."""
    if hasattr(row_buckets, "tolist") and getattr(row_buckets, "ndim", 1) == 1:
        row_buckets = row_buckets.tolist()
    if isinstance(row_buckets, (str, bytes)) or not isinstance(row_buckets, Sequence):
        raise ShapeBucketError(f"row_buckets must be a list of ints >= 1, got {row_buckets!r}")
    sizes = [check_int(f"row_buckets[{i}]", v, minimum=1) for i, v in enumerate(row_buckets)]
    if not sizes:
        raise ShapeBucketError("row_buckets must hold at least one size, got []")
    return sorted(set(sizes))

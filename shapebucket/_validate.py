"""The checks of scalar user input (ints, numbers, flags) and of the rows built from them,
so the same input gets the same answer everywhere; a dataset's lengths have their own
check, :func:`shapebucket._lengths.check_lengths`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ShapeBucketError

__all__ = [
    "check_batch_sizes",
    "check_flag",
    "check_int",
    "check_number",
    "check_row_buckets",
    "is_int_key",
    "rows_per_key",
]


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool, or a :class:`ShapeBucketError` naming ``name``: a string such
    as ``"no"`` is true in Python and would silently mean the opposite.

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

    >>> check_number("ratio", 1.5, above=1)
    1.5
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
    try:
        number = float(value)
    except OverflowError:  # an int past the float range: refused as not finite
        number = math.inf
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


def check_batch_sizes(value: Any, buckets: Iterable[Any]) -> int | dict[Any, int] | None:
    """Rows per bucket (or per cell, a tuple key; the messages say which), checked:
    ``None``, an int >= 1, or a mapping with an int >= 1 for exactly the buckets (in their
    order).

    >>> check_batch_sizes({16: 2, 8: 4}, [8, 16])
    {8: 4, 16: 2}
    """
    if value is None:
        return None
    keys = list(buckets)
    word = "cell" if keys and isinstance(keys[0], tuple) else "bucket"
    if not isinstance(value, Mapping):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise ShapeBucketError(
                f"rows must be an int >= 1 or a mapping {word} -> rows, got {value!r}"
            )
        return check_int("rows", value, minimum=1)
    missing = [b for b in keys if b not in value]
    # a typo'd bucket, or a sampler with other buckets: never silently unused; a float or
    # bool key (8.0, True) equals a bucket but is a computation gone wrong: named too
    extra = [b for b in value if b not in keys or not is_int_key(b)]
    if missing or extra:
        lacks = [f"has no batch size for {word}s {missing}"] if missing else []
        names = [f"names {extra}, which are not {word}s of {keys}"] if extra else []
        raise ShapeBucketError(
            f"rows {' and '.join(lacks + names)}; give rows for exactly the {word}s "
            f"{keys} (pass the sampler's rows, built from the same {word}s)"
        )
    return {b: check_int(f"rows[{b}]", value[b], minimum=1) for b in keys}


def is_int_key(key: Any) -> bool:
    """Whether ``key`` is an int (not a bool) or a tuple of them, as a bucket or cell is."""
    if isinstance(key, tuple):
        return all(is_int_key(k) for k in key)
    return isinstance(key, numbers.Integral) and not isinstance(key, (bool, np.bool_))


def rows_per_key(value: Any, keys: Iterable[Any]) -> dict[Any, int]:
    """:func:`check_batch_sizes` of ``value`` (not ``None``) as ``{key: rows}``.

    >>> rows_per_key(4, [8, 16]), rows_per_key({(8, 4): 2}, [(8, 4)])
    ({8: 4, 16: 4}, {(8, 4): 2})
    """
    keys = list(keys)
    rows = check_batch_sizes(value, keys)
    if rows is None:
        word = "cell" if keys and isinstance(keys[0], tuple) else "bucket"
        raise ShapeBucketError(f"rows must be an int >= 1 or a mapping {word} -> rows, got None")
    return rows if isinstance(rows, dict) else dict.fromkeys(keys, rows)


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

"""``Buckets``: the sorted, immutable set of sequence lengths a model is compiled for.

Edge rule: a length equal to a boundary lands in that bucket. ``bucket_for(L)``
is the smallest bucket ``b`` with ``L <= b``, so with buckets ``(8, 16)`` the
lengths 0..8 map to 8 and 9..16 map to 16.

Buckets are ints ``>= 2`` because ``torch.compile`` always specializes sizes 0
and 1: a bucket of 1 would compile a graph no other length can reuse.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .._lengths import MAX_BUCKET, check_lengths, round_up
from .._validate import check_int, check_number
from ..errors import ShapeBucketError

__all__ = ["MAX_MULTIPLES", "Buckets", "as_buckets"]

#: The most buckets :meth:`Buckets.multiples` makes: each bucket is a compiled graph,
#: and a grid finer than this is a mistake (``of=1`` up to a long ``max_len``).
MAX_MULTIPLES = 1 << 16


class Buckets:
    """An immutable, sorted set of bucket lengths, each an int >= 2.

    Hashable, comparable by value, iterable, picklable.

    >>> b = Buckets([16, 32, 64])
    >>> b.bucket_for(17), b.bucket_for(32), len(b), b.max_len
    (32, 32, 3, 64)
    >>> Buckets.multiples(32, max_len=100)
    Buckets([32, 64, 96, 128])
    """

    __slots__ = ("_array", "_lengths")
    _lengths: tuple[int, ...]
    _array: np.ndarray

    def __init__(self, lengths: Iterable[int]) -> None:
        if isinstance(lengths, Buckets):
            values: tuple[int, ...] = lengths.lengths
        else:
            if hasattr(lengths, "dtype") and hasattr(lengths, "tolist"):
                lengths = lengths.tolist()  # a numpy array or a tensor: Python ints, as a list
            if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
                raise ShapeBucketError(
                    f"Buckets takes an iterable of ints, got {lengths!r}; "
                    "for example Buckets([16, 32, 64])"
                )
            values = tuple(check_int(f"bucket {i}", v, minimum=2) for i, v in enumerate(lengths))
            for i, v in enumerate(values):
                if v > MAX_BUCKET:
                    raise ShapeBucketError(
                        f"bucket {i} is {v} > {MAX_BUCKET} (2**31), the longest bucket "
                        "shapebucket accepts: one row of int64 ids at that length would not fit "
                        "in memory; check where the bucket lengths came from"
                    )
            if not values:
                raise ShapeBucketError("Buckets needs at least one length, got an empty sequence")
            for i in range(1, len(values)):
                if values[i] == values[i - 1]:
                    raise ShapeBucketError(
                        f"bucket lengths must be unique: {values[i]} appears twice in {list(values)}"
                    )
                if values[i] < values[i - 1]:
                    raise ShapeBucketError(
                        f"bucket lengths must be sorted ascending: {values[i]} follows {values[i - 1]} "
                        f"in {list(values)}; pass sorted(lengths) if the order does not matter"
                    )
        object.__setattr__(self, "_lengths", values)
        array = np.asarray(values, dtype=np.int64)
        array.flags.writeable = False
        object.__setattr__(self, "_array", array)

    # -- constructors -------------------------------------------------------

    @classmethod
    def multiples(cls, of: int, max_len: int, min_len: int | None = None) -> Buckets:
        """Every multiple of ``of`` from ``min_len`` (default ``of``) up to ``max_len``.

        Both ends are rounded up to a multiple of ``of`` (and to at least 2).

        >>> Buckets.multiples(8, max_len=30)
        Buckets([8, 16, 24, 32])
        >>> Buckets.multiples(8, max_len=32, min_len=17)
        Buckets([24, 32])
        """
        of = check_int("of", of, minimum=1, maximum=MAX_BUCKET)
        max_len = check_int("max_len", max_len, minimum=1, maximum=MAX_BUCKET)
        low = of if min_len is None else check_int("min_len", min_len, minimum=1)
        if min_len is not None and low > max_len:
            raise ShapeBucketError(f"min_len ({low}) must be <= max_len ({max_len})")
        first = round_up(max(low, 2), of)
        last = round_up(max_len, of)
        count = (last - first) // of + 1
        if count > MAX_MULTIPLES:
            raise ShapeBucketError(
                f"Buckets.multiples({of}, max_len={max_len}) would make {count:,} buckets, more "
                f"than {MAX_MULTIPLES:,}; each bucket is one compiled graph: use a larger `of`, "
                "or fit_buckets(lengths, k) for a few buckets that fit the data"
            )
        return cls(range(first, last + 1, of))

    @classmethod
    def powers_of_two(cls, max_len: int, min_len: int = 8) -> Buckets:
        """Powers of two from ``min_len`` up to the first one >= ``max_len``.

        >>> Buckets.powers_of_two(100)
        Buckets([8, 16, 32, 64, 128])
        """
        max_len = check_int("max_len", max_len, minimum=2)
        min_len = check_int("min_len", min_len, minimum=2)
        if min_len > max_len:
            raise ShapeBucketError(f"min_len ({min_len}) must be <= max_len ({max_len})")
        lo = 1 << (min_len - 1).bit_length()
        hi = 1 << (max_len - 1).bit_length()
        return cls(1 << e for e in range(lo.bit_length() - 1, hi.bit_length()))

    @classmethod
    def geometric(cls, min_len: int, max_len: int, ratio: float, align: int = 8) -> Buckets:
        """Boundaries growing by ``ratio``, each rounded up to a multiple of ``align``.

        Starts at ``min_len`` and ends at the first boundary >= ``max_len``
        (``max_len`` rounded up to ``align``). When rounding would repeat a value
        the next multiple of ``align`` is taken, so the result is strictly
        increasing.

        >>> Buckets.geometric(16, 256, ratio=1.5, align=8)
        Buckets([16, 24, 40, 64, 96, 144, 216, 256])
        """
        min_len = check_int("min_len", min_len, minimum=2)
        max_len = check_int("max_len", max_len, minimum=2)
        align = check_int("align", align, minimum=1)
        ratio = check_number("ratio", ratio, above=1)
        if min_len > max_len:
            raise ShapeBucketError(f"min_len ({min_len}) must be <= max_len ({max_len})")
        last = round_up(max_len, align)
        out = [round_up(min_len, align)]
        while out[-1] < last:
            nxt = max(round_up(math.ceil(out[-1] * float(ratio)), align), out[-1] + align)
            out.append(min(nxt, last))
        return cls(out)

    # -- queries ------------------------------------------------------------

    @property
    def lengths(self) -> tuple[int, ...]:
        """The bucket lengths, ascending."""
        return self._lengths

    @property
    def max_len(self) -> int:
        """The largest bucket: the longest sample these buckets accept."""
        return self._lengths[-1]

    def bucket_for(self, length: int) -> int:
        """The smallest bucket >= ``length`` (a length equal to a boundary lands in it).

        >>> Buckets([8, 16]).bucket_for(8), Buckets([8, 16]).bucket_for(9)
        (8, 16)
        """
        length = check_int("length", length, minimum=0)
        i = bisect.bisect_left(self._lengths, length)
        if i == len(self._lengths):
            raise ShapeBucketError(self._overflow_message(length))
        return self._lengths[i]

    def index_for_many(self, lengths: Any) -> np.ndarray:
        """Vectorised bucket *index* (0-based position in :attr:`lengths`) per length.

        >>> Buckets([8, 16]).index_for_many([3, 9])
        array([0, 1])
        """
        arr = check_lengths(lengths, minimum=0, allow_empty=True)
        if arr.size and int(arr.max()) > self.max_len:
            i = int(np.argmax(arr > self.max_len))
            raise ShapeBucketError(f"length at index {i}: " + self._overflow_message(int(arr[i])))
        return np.searchsorted(self._array, arr, side="left")

    def bucket_for_many(self, lengths: Any) -> np.ndarray:
        """Vectorised :meth:`bucket_for` over an array of lengths.

        >>> Buckets([8, 16]).bucket_for_many(np.array([1, 8, 9, 16]))
        array([ 8,  8, 16, 16])
        """
        return self._array[self.index_for_many(lengths)]

    def _overflow_message(self, length: int) -> str:
        return (
            f"length {length} > largest bucket {self.max_len} in {self!r}; add a bucket >= {length} "
            "or truncate the sample"
        )

    # -- protocol -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._lengths)

    def __iter__(self) -> Iterator[int]:
        return iter(self._lengths)

    def __contains__(self, item: object) -> bool:
        return item in self._lengths

    def __getitem__(self, i: int) -> int:
        return self._lengths[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Buckets):
            return NotImplemented
        return self._lengths == other._lengths

    def __lt__(self, other: Buckets) -> bool:
        if not isinstance(other, Buckets):
            return NotImplemented
        return self._lengths < other._lengths

    def __hash__(self) -> int:
        return hash(("Buckets", self._lengths))

    def __repr__(self) -> str:
        return f"Buckets({list(self._lengths)})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Buckets is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Buckets, (self._lengths,))


def as_buckets(buckets: Buckets | Iterable[int]) -> Buckets:
    """``buckets`` as a :class:`Buckets` (a plain list of ints is accepted)."""
    return buckets if isinstance(buckets, Buckets) else Buckets(buckets)

"""A collator's first step: its samples read into checked columns (:func:`read_columns`,
behind :meth:`~.base.Collator.read`), with the sequence keys found or checked, the
length key's lengths, and the errors that name a sample whose keys disagree. The
structure of the samples themselves (keys, values, lengths along ``seq_dim``) is
:mod:`.samples`'s job."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import ShapeBucketError
from .engine import Key
from .samples import KeyRoles, Where, check_collisions, is_sequence, lengths_of, namer, to_columns

__all__ = ["Columns", "read_columns"]


class Columns(NamedTuple):
    """A batch of samples read and checked: one list per key, and each sample's length."""

    kind: str  # "dict", "tuple" or "bare"
    keys: list[Key]
    seq_keys: list[Key]
    columns: dict[Key, list[Any]]
    lengths: np.ndarray  # int64 [n], the length key's
    length_key: Key
    where: Where


def read_columns(
    samples: Sequence[Any],
    *,
    who: str,
    roles: KeyRoles,
    seq_dim: int,
    mask_key: str | None,
    row_mask_key: str | None,
    chosen: Sequence[Key] | None,
) -> Columns:
    """``samples`` as checked columns and each sample's length, for the collator named
    ``who`` (:meth:`~.base.Collator.read`): its ``roles``, ``seq_dim``, token mask and row
    mask keys, and the sequence keys it was given (``chosen``; ``None``: found)."""
    if not isinstance(samples, Sequence) or isinstance(samples, (str, bytes)) or len(samples) == 0:
        raise ShapeBucketError(f"{who} needs a non-empty list of samples, got {samples!r}")
    kind, keys, columns = to_columns(samples)
    where = namer(kind, columns, roles.index)
    seq_keys = _sequence_keys(keys, columns, chosen, mask_key)
    check_collisions(seq_keys, columns, mask_key, row_mask_key)  # str keys: dict samples only
    length_key = roles.length if roles.length is not None else seq_keys[0]
    if length_key not in seq_keys:
        raise ShapeBucketError(
            f"KeyRoles(length={length_key!r}) is not a sequence key; sequence keys are {seq_keys}"
        )
    lens = lengths_of(length_key, columns[length_key], seq_dim, where)
    for k in seq_keys:
        if k != length_key:
            other = lengths_of(k, columns[k], seq_dim, where)
            if other.tobytes() != lens.tobytes():  # both int64 [n]
                _disagree(seq_keys, columns, length_key, lens, k, other, where)
    return Columns(kind, keys, seq_keys, columns, lens, length_key, where)


def _disagree(
    seq_keys: list[Key],
    columns: dict[Key, list[Any]],
    length_key: Key,
    lens: np.ndarray,
    key: Key,
    other: np.ndarray,
    where: Where,
) -> None:
    """Raise: sample ``i``'s ``key`` is not as long as its ``length_key``, with a hint
    when some keys have one shape in every sample (not sequences)."""
    i = int(np.argmax(other != lens))
    n = len(lens)
    fixed = [k for k in seq_keys if n > 1 and len({np.shape(v) for v in columns[k]}) == 1]
    hint = "pass sequence_keys=[...] to pad only some keys"
    if fixed and len(fixed) < len(seq_keys):
        rest = [k for k in seq_keys if k not in fixed]
        hint = (
            f"{fixed} have one shape in every sample: if they are not sequences "
            f"(an image, fixed features), pass sequence_keys={rest} and they are "
            "stacked instead"
        )
    raise ShapeBucketError(
        f"{where(i)}: sequence keys disagree in length: {length_key!r} has {int(lens[i])}, "
        f"{key!r} has {int(other[i])}; {hint}"
    )


def _sequence_keys(
    keys: list[Key], columns: dict[Key, list[Any]], chosen: Sequence[Key] | None, mask_key: Key
) -> list[Key]:
    """The sequence keys: ``chosen`` (each in the samples), else every key whose value in
    sample 0 is a sequence, an existing mask last."""
    if chosen is not None:
        for k in chosen:
            if k not in columns:
                raise ShapeBucketError(
                    f"sequence key {k!r} is not in the samples; sample 0 has keys {keys}"
                )
        return list(chosen)
    seq = [k for k in keys if is_sequence(columns[k][0])]
    if not seq:
        raise ShapeBucketError(
            f"sample 0 has no sequence value (keys {keys}); sequences are lists, tuples, arrays "
            "or tensors with ndim >= 1"
        )
    if mask_key in seq and len(seq) > 1:  # a str: only dict samples have it
        seq.remove(mask_key)  # an existing mask is padded, but never defines the length
        seq.append(mask_key)
    return seq

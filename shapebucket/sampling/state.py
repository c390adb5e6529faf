"""How a sampler's state is written down and read back: the ``state_dict()`` keys, the
settings' :func:`fingerprint`, :func:`saved_state` and the checks of :func:`read_state`."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._validate import check_int
from ..errors import ShapeBucketError

__all__ = [
    "EPOCH_KEY",
    "FINGERPRINT_KEY",
    "NUM_BATCHES_KEY",
    "POSITION_KEY",
    "SEED_KEY",
    "fingerprint",
    "read_state",
    "saved_state",
]

#: ``state_dict()`` keys: the epoch the state is in, the batches of it consumed, the seed,
#: the number of batches of that epoch (informative), and the settings' fingerprint.
EPOCH_KEY = "epoch"
POSITION_KEY = "position"
SEED_KEY = "seed"
NUM_BATCHES_KEY = "num_batches"
FINGERPRINT_KEY = "fingerprint"
_REQUIRED_KEYS = (EPOCH_KEY, POSITION_KEY, SEED_KEY, FINGERPRINT_KEY)

#: The fix for a state that is not what ``state_dict()`` wrote (truncated, retyped, edited).
_DAMAGED = (
    "the state is damaged: load the dict state_dict() returned, unchanged (or resume from "
    "an earlier checkpoint, or start afresh with set_epoch)"
)


def fingerprint(lengths: np.ndarray, settings: tuple[Any, ...]) -> str:
    """The 40 hex digits (sha1) of ``lengths`` and ``repr(settings)``: a saved state
    loads only into a sampler whose lengths and settings give the same digits.

    >>> len(fingerprint(np.array([3, 5]), ("BucketBatchSampler", (8,))))
    40
    """
    h = hashlib.sha1(lengths.tobytes())
    h.update(repr(settings).encode())
    return h.hexdigest()


def saved_state(
    epoch: int, position: int, seed: int, num_batches: int, digest: str
) -> dict[str, Any]:
    """The dict ``state_dict()`` returns, its keys in this order: the module's constants."""
    return {
        EPOCH_KEY: epoch,
        POSITION_KEY: position,
        SEED_KEY: seed,
        NUM_BATCHES_KEY: num_batches,
        FINGERPRINT_KEY: digest,
    }


def read_state(
    state: Any, expected: str, count_for: Callable[[int, int], int]
) -> tuple[int, int, int]:
    """``(seed, epoch, position)`` of a saved ``state``, after checking that it is what
    ``state_dict()`` wrote, that its fingerprint is ``expected`` (the same settings),
    and that its position lies inside its epoch (``count_for(seed, epoch)`` batches). A
    ``ShapeBucketError`` names what does not fit."""
    if not isinstance(state, Mapping):
        raise ShapeBucketError(
            f"state must be the dict that state_dict() returned, got {type(state).__name__}"
            f" {_short(state)}; {_DAMAGED}"
        )
    for key in _REQUIRED_KEYS:
        if key not in state:
            raise ShapeBucketError(
                f"state has no {key!r} (its keys: {sorted(map(str, state))}); {_DAMAGED}"
            )
    saved = state[FINGERPRINT_KEY]
    if not (isinstance(saved, str) and len(saved) == 40 and set(saved) <= set("0123456789abcdef")):
        raise ShapeBucketError(
            f"state[{FINGERPRINT_KEY!r}] is {_short(saved)}, not the 40 hex digits "
            f"state_dict() writes; {_DAMAGED}"
        )
    if saved != expected:
        raise ShapeBucketError(
            "state was saved by a sampler with other lengths, buckets, rows or world size; "
            "resume with the same configuration (or start the epoch afresh with set_epoch)"
        )
    seed = _state_int(state, SEED_KEY)
    epoch = _state_int(state, EPOCH_KEY)
    # the number of batches of the saved epoch (a packed epoch's count varies by epoch)
    position = _state_int(state, POSITION_KEY, maximum=count_for(seed, epoch))
    return seed, epoch, position


def _short(value: Any) -> str:
    """``repr(value)``, cut to 80 characters: a damaged state can hold anything."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _state_int(state: Mapping[str, Any], key: str, maximum: int | None = None) -> int:
    """``state[key]`` as an int >= 0 (<= ``maximum``), or a ``ShapeBucketError`` naming the
    key, the value and the fix."""
    value = state[key]
    try:
        return check_int(f"state[{key!r}]", value, minimum=0, maximum=maximum)
    except ShapeBucketError as e:
        raise ShapeBucketError(f"{str(e)[:200]}; {_DAMAGED}") from None

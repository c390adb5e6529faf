"""What users do instead: transformers' length-grouped batching (``group_by_length=True``;
its own ``LengthGroupedSampler`` when installed, else :func:`grouped_indices_reference`,
line for line), and fixed-length packing into rows of the maximum length, as TRL's
``pack_dataset(strategy="bfd")`` or torchtune's ``PackedDataset`` (``"next-fit"``) packs,
written out here (docs/benchmarks.md, "What the fixed-length peer mirrors, precisely")."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "FixedLengthCollator",
    "fixed_length_packs",
    "grouped_indices_reference",
    "length_grouped_indices",
    "source",
]

#: TRL packs a ``datasets`` table with ``map(batched=True)``, 1,000 samples at a time.
TRL_CHUNK = 1000


def mega_batch_mult(num_samples: int, batch_size: int) -> int:
    """transformers' default mega-batch multiplier for a dataset of ``num_samples``: 50, or
    the number that makes 4 mega-batches, whichever is smaller (at least 1).

    >>> mega_batch_mult(200_000, 64), mega_batch_mult(6_000, 64), mega_batch_mult(10, 64)
    (50, 23, 1)
    """
    return min(num_samples // (batch_size * 4), 50) or 1


def grouped_indices_reference(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, mult: int | None = None
) -> list[int]:
    """transformers' ``get_length_grouped_indices``, written out: the same torch random
    draws, the same stable sorts, the same swap (``mult``: default as transformers')."""
    mult = mega_batch_mult(len(lengths), batch_size) if mult is None else mult
    indices = torch.randperm(len(lengths), generator=generator)
    size = mult * batch_size
    megabatches = [indices[i : i + size].tolist() for i in range(0, len(lengths), size)]
    megabatches = [sorted(m, key=lambda i: lengths[i], reverse=True) for m in megabatches]
    maximums = [lengths[m[0]] for m in megabatches]
    top = int(torch.argmax(torch.tensor(maximums)).item())
    megabatches[0][0], megabatches[top][0] = megabatches[top][0], megabatches[0][0]
    return [i for m in megabatches for i in m]


def source() -> str:
    """Which implementation :func:`length_grouped_indices` uses here."""
    try:
        import transformers
        from transformers.trainer_pt_utils import LengthGroupedSampler  # noqa: F401
    except ImportError:
        return "shapebucket's re-implementation of transformers' LengthGroupedSampler"
    return f"transformers {transformers.__version__} LengthGroupedSampler"


def length_grouped_indices(
    lengths: np.ndarray, batch_size: int, *, seed: int, dataset_size: int | None = None
) -> np.ndarray:
    """One epoch's index order, as ``Trainer(group_by_length=True)`` forms it. A sample
    of a larger dataset (``dataset_size``) is grouped in the mega-batches the whole dataset
    gets (:func:`mega_batch_mult`), so the timed set is batched as well as a real epoch.

    >>> order = length_grouped_indices(np.array([5, 1, 9, 3]), 2, seed=0)
    >>> sorted(order.tolist())
    [0, 1, 2, 3]
    """
    values = [int(x) for x in lengths]
    generator = torch.Generator().manual_seed(seed)
    mult = mega_batch_mult(len(values) if dataset_size is None else dataset_size, batch_size)
    try:
        from transformers.trainer_pt_utils import get_length_grouped_indices
    except ImportError:
        return np.asarray(grouped_indices_reference(values, batch_size, generator, mult))
    return np.asarray(
        get_length_grouped_indices(values, batch_size, mega_batch_mult=mult, generator=generator)
    )


def _best_fit_decreasing(lengths: np.ndarray, ids: np.ndarray, capacity: int) -> list[list[int]]:
    """TRL's ``_pack_bfd`` on one chunk: longest first, each into the fullest row it fits."""
    order = np.argsort(-lengths, kind="stable")
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free space, row number), sorted: best fit = bisect
    for i in order.tolist():
        n = int(lengths[i])
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            space, r = free.pop(at)
        else:
            space, r = capacity, len(rows)
            rows.append([])
        rows[r].append(int(ids[i]))
        if space - n > 0:
            bisect.insort(free, (space - n, r))
    return rows


def _next_fit(lengths: np.ndarray, ids: np.ndarray, capacity: int) -> list[list[int]]:
    """torchtune's ``PackedDataset``: in order, a new row when a sample does not fit."""
    rows: list[list[int]] = []
    used = capacity
    for n, i in zip(lengths.tolist(), ids.tolist(), strict=True):
        if used + n > capacity:
            rows.append([])
            used = 0
        rows[-1].append(int(i))
        used += n
    return rows


def fixed_length_packs(
    lengths: np.ndarray, capacity: int, rows: int, *, seed: int, packer: str = "bfd"
) -> list[list[list[int]]]:
    """One epoch of fixed-length packing: batches of ``rows`` rows, each row a list of
    sample indices whose lengths sum to at most ``capacity`` (a batch may hold fewer rows:
    the last one; :class:`FixedLengthCollator` pads it with empty rows).

    >>> packs = fixed_length_packs(np.array([5, 3, 4, 2, 6]), 8, 2, seed=0)
    >>> sorted(sorted(r) for b in packs for r in b)
    [[0, 1], [2], [3, 4]]
    """
    if int(lengths.max(initial=0)) > capacity:
        raise ValueError(f"a sample of {int(lengths.max())} tokens > row length {capacity}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths))  # the dataset's (shuffled) order
    packed: list[list[int]] = []
    if packer == "bfd":
        for c in range(0, len(order), TRL_CHUNK):
            ids = order[c : c + TRL_CHUNK]
            packed.extend(_best_fit_decreasing(lengths[ids], ids, capacity))
    elif packer == "next-fit":
        packed = _next_fit(lengths[order], order, capacity)
    else:
        raise ValueError(f"unknown packer {packer!r}: 'bfd' or 'next-fit'")
    shuffled = [packed[i] for i in rng.permutation(len(packed))]  # the loader's RandomSampler
    return [shuffled[i : i + rows] for i in range(0, len(shuffled), rows)]


@dataclass(frozen=True)
class FixedLengthCollator:
    """Lay rows of samples into ``rows x length`` tokens: ``input_ids`` (pad 0), ``labels``
    (pad -100), ``position_ids`` (restarting at 0 in each sample, 0 on padding) and
    ``document_ids`` (0, 1, ... in each row, -1 on padding), always the same shape.

    ``sizes`` gives the samples per row in order (the packer's rows).

    >>> c = FixedLengthCollator(length=4, rows=2)
    >>> s = [{"input_ids": torch.tensor([1, 2]), "labels": torch.tensor([2, 3])}] * 3
    >>> c(s, [2, 1])["document_ids"].tolist()
    [[0, 0, 1, 1], [0, 0, -1, -1]]
    """

    length: int
    rows: int

    def __call__(
        self, samples: Sequence[dict[str, torch.Tensor]], sizes: Sequence[int]
    ) -> dict[str, Any]:
        edges = np.cumsum([0, *sizes])
        rows = [list(range(a, b)) for a, b in itertools.pairwise(edges)]
        if len(rows) > self.rows:
            raise ValueError(f"{len(rows)} rows of samples > rows={self.rows}")
        shape = (self.rows, self.length)
        out = {
            "input_ids": torch.zeros(shape, dtype=torch.int64),
            "labels": torch.full(shape, -100, dtype=torch.int64),
            "position_ids": torch.zeros(shape, dtype=torch.int64),
            "document_ids": torch.full(shape, -1, dtype=torch.int32),
        }
        for r, members in enumerate(rows):
            at = 0
            for d, i in enumerate(members):
                ids, n = samples[i]["input_ids"], len(samples[i]["input_ids"])
                out["input_ids"][r, at : at + n] = ids
                out["labels"][r, at : at + n] = samples[i]["labels"]
                out["position_ids"][r, at : at + n] = torch.arange(n)
                out["document_ids"][r, at : at + n] = d
                at += n
        return out

"""What users do instead: transformers' length-grouped batching (``group_by_length=True``).

The benchmark's strongest peer is the recipe a Hugging Face ``Trainer`` user
already has: ``LengthGroupedSampler`` (indices shuffled, cut into mega-batches
of 50 batches, each sorted by length, the longest sample first), cut into
batches of ``batch_size`` and padded to the longest sample rounded up to 8
(``DataCollatorWithPadding(pad_to_multiple_of=8)``). When transformers is
installed its own sampler is used; otherwise :func:`grouped_indices_reference`,
a line-for-line re-implementation (``tests/test_bench.py`` checks the two agree
whenever the ``hf`` extra is installed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["grouped_indices_reference", "length_grouped_indices", "source"]


def grouped_indices_reference(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator
) -> list[int]:
    """transformers' ``get_length_grouped_indices`` with its default mega-batch size,
    written out: the same torch random draws, the same stable sorts, the same swap."""
    mult = min(len(lengths) // (batch_size * 4), 50) or 1
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


def length_grouped_indices(lengths: np.ndarray, batch_size: int, *, seed: int) -> np.ndarray:
    """One epoch's index order, as ``Trainer(group_by_length=True)`` forms it.

    >>> order = length_grouped_indices(np.array([5, 1, 9, 3]), 2, seed=0)
    >>> sorted(order.tolist())
    [0, 1, 2, 3]
    """
    values = [int(x) for x in lengths]
    generator = torch.Generator().manual_seed(seed)
    try:
        from transformers.trainer_pt_utils import LengthGroupedSampler
    except ImportError:
        return np.asarray(grouped_indices_reference(values, batch_size, generator))
    return np.asarray(list(LengthGroupedSampler(batch_size, lengths=values, generator=generator)))

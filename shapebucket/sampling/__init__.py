"""Sampling: which samples go into each batch, distributed and resumable.

>>> from shapebucket.sampling import BucketBatchSampler
>>> BucketBatchSampler([3, 5, 9], [8, 16], batch_size=2, shuffle=False).shapes()
frozenset({(1, 16), (2, 8)})
"""

from ..fit.batches import SamplerReport
from .base import ResumableBatchSampler
from .bucket import BucketBatchSampler
from .cells import CellBatchSampler
from .packed import PackedBatchSampler

__all__ = [
    "BucketBatchSampler",
    "CellBatchSampler",
    "PackedBatchSampler",
    "ResumableBatchSampler",
    "SamplerReport",
]

"""Sampling: which samples go into each batch, distributed and resumable.

>>> from shapebucket.sampling import BucketBatchSampler
>>> sorted(BucketBatchSampler([3, 5, 9], [8, 16], rows=2, shuffle=False).shapes())
[Shape(rows=1, length=16), Shape(rows=2, length=8)]
"""

from .base import ResumableBatchSampler
from .bucket import BucketBatchSampler
from .cells import CellBatchSampler
from .packed import PackedBatchSampler

__all__ = [
    "BucketBatchSampler",
    "CellBatchSampler",
    "PackedBatchSampler",
    "ResumableBatchSampler",
]

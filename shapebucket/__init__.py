"""shapebucket: pad variable-length batches to a few bucket lengths for torch.compile.

>>> import shapebucket
>>> shapebucket.Buckets.powers_of_two(100).bucket_for(70)
128
"""

from .buckets import Buckets
from .collate import BucketCollator, CollateStats
from .errors import ShapeBucketError

__all__ = [
    "BucketCollator",
    "Buckets",
    "CollateStats",
    "ShapeBucketError",
]

__version__ = "0.1.0"

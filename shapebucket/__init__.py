"""shapebucket: pad variable-length batches to a few bucket lengths for torch.compile.

>>> import shapebucket
>>> shapebucket.Buckets.powers_of_two(100).bucket_for(70)
128
"""

from .buckets import Buckets
from .collate import BucketCollator, CollateStats
from .errors import ShapeBucketError
from .fit import PaddingReport, PolicyComparison, compare_policies, fit_buckets, padding_report
from .sampler import BucketBatchSampler, SamplerStats

__all__ = [
    "BucketBatchSampler",
    "BucketCollator",
    "Buckets",
    "CollateStats",
    "PaddingReport",
    "PolicyComparison",
    "SamplerStats",
    "ShapeBucketError",
    "compare_policies",
    "fit_buckets",
    "padding_report",
]

__version__ = "0.1.0"

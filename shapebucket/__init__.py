"""shapebucket: pad variable-length batches to a few bucket lengths for torch.compile.

>>> import shapebucket
>>> shapebucket.Buckets.powers_of_two(100).bucket_for(70)
128
"""

from .buckets import Buckets
from .collate import BucketCollator, CollateStats
from .compile_cache import load_compile_cache, save_compile_cache
from .errors import ShapeBucketError
from .fit import KChoice, PaddingReport, choose_k, fit_buckets, padding_report
from .policies import PolicyComparison, compare_policies
from .recompiles import CompileCounter, count_compiles, mark_dynamic, no_recompiles
from .regions import compile_regions
from .sampler import BucketBatchSampler, SamplerStats
from .warmup import PrewarmReport, prewarm

__all__ = [
    "BucketBatchSampler",
    "BucketCollator",
    "Buckets",
    "CollateStats",
    "CompileCounter",
    "KChoice",
    "PaddingReport",
    "PolicyComparison",
    "PrewarmReport",
    "SamplerStats",
    "ShapeBucketError",
    "choose_k",
    "compare_policies",
    "compile_regions",
    "count_compiles",
    "fit_buckets",
    "load_compile_cache",
    "mark_dynamic",
    "no_recompiles",
    "padding_report",
    "prewarm",
    "save_compile_cache",
]

__version__ = "0.1.0"

"""shapebucket: pad variable-length batches to a few bucket lengths for torch.compile.

>>> import shapebucket
>>> shapebucket.Buckets.powers_of_two(100).bucket_for(70)
128
"""

from .attention import document_block_mask, document_causal_mask
from .buckets import Buckets
from .collate import BucketCollator, CollateStats
from .compile_cache import load_compile_cache, save_compile_cache
from .device_pad import FlatBatch
from .errors import ShapeBucketError
from .fit import KChoice, PaddingReport, choose_k, fit_buckets, padding_report
from .packed import PackedCollator
from .packing import (
    PackedBatchSampler,
    PackingFit,
    PackingReport,
    fit_packing,
    packing_report,
    rows_for_tokens,
)
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
    "FlatBatch",
    "KChoice",
    "PackedBatchSampler",
    "PackedCollator",
    "PackingFit",
    "PackingReport",
    "PaddingReport",
    "PolicyComparison",
    "PrewarmReport",
    "SamplerStats",
    "ShapeBucketError",
    "choose_k",
    "compare_policies",
    "compile_regions",
    "count_compiles",
    "document_block_mask",
    "document_causal_mask",
    "fit_buckets",
    "fit_packing",
    "load_compile_cache",
    "mark_dynamic",
    "no_recompiles",
    "packing_report",
    "padding_report",
    "prewarm",
    "rows_for_tokens",
    "save_compile_cache",
]

__version__ = "0.1.0"

"""shapebucket: pad variable-length batches to a few bucket lengths for torch.compile.

>>> import shapebucket
>>> shapebucket.Buckets.powers_of_two(100).bucket_for(70)
128
"""

from .collate.attention import document_block_mask, document_causal_mask
from .collate.bucket import BucketCollator, CollateReport
from .collate.device import FlatBatch
from .collate.packed import PackedCollator
from .compile.cache import load_compile_cache, save_compile_cache
from .compile.prewarm import PrewarmReport, prewarm
from .compile.recompiles import CompileCounter, mark_dynamic, no_recompiles
from .compile.regions import compile_regions
from .errors import ShapeBucketError
from .plan.buckets import Buckets
from .plan.fit import fit_buckets
from .plan.kchoice import KChoiceReport, choose_k
from .plan.packing import PackingReport, rows_for_tokens
from .plan.packing_fit import PackingFitReport, fit_packing, packing_report
from .plan.padding import PaddingReport, padding_report
from .plan.policies import PolicyReport, compare_policies
from .sampling.bucket import BucketBatchSampler, SamplerReport
from .sampling.packed import PackedBatchSampler

__all__ = [
    "BucketBatchSampler",
    "BucketCollator",
    "Buckets",
    "CollateReport",
    "CompileCounter",
    "FlatBatch",
    "KChoiceReport",
    "PackedBatchSampler",
    "PackedCollator",
    "PackingFitReport",
    "PackingReport",
    "PaddingReport",
    "PolicyReport",
    "PrewarmReport",
    "SamplerReport",
    "ShapeBucketError",
    "choose_k",
    "compare_policies",
    "compile_regions",
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

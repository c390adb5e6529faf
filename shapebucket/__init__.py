"""shapebucket: make ``torch.compile`` fast on variable-length data.

Pad each batch to one of a few bucket lengths (or pack whole samples into rows of a
few lengths), compile every shape before training, and prove nothing recompiles
after. The top level holds the pipeline of the README; the rest lives by concern in
:mod:`shapebucket.fit` (buckets, fits, reports), :mod:`shapebucket.plan` (the shape plan),
:mod:`shapebucket.advise` (K from the job, policies side by side),
:mod:`shapebucket.sampling`, :mod:`shapebucket.collate` and :mod:`shapebucket.compile`;
:class:`BucketedModel` (:mod:`shapebucket.bucketed`) pads any loop's calls instead.

>>> import shapebucket
>>> shapebucket.fit_buckets([5, 9, 12, 30, 31], k=2, align=8)
Buckets([16, 32])
"""

from .bucketed import BucketedModel
from .collate.attention import document_block_mask, document_causal_mask
from .collate.bucket import BucketCollator
from .collate.packed import PackedCollator
from .compile.prewarm import prewarm
from .compile.recompiles import no_recompiles
from .errors import ShapeBucketError
from .fit.optimal import fit_buckets
from .fit.packing_fit import fit_packing
from .plan.shapes import ShapePlan
from .sampling.bucket import BucketBatchSampler
from .sampling.packed import PackedBatchSampler

__all__ = [
    "BucketBatchSampler",
    "BucketCollator",
    "BucketedModel",
    "PackedBatchSampler",
    "PackedCollator",
    "ShapeBucketError",
    "ShapePlan",
    "document_block_mask",
    "document_causal_mask",
    "fit_buckets",
    "fit_packing",
    "no_recompiles",
    "prewarm",
]

__version__ = "0.1.0"

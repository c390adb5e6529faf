"""Collation: padding batches to their bucket (or packing them), on the host or the device.

One engine (:mod:`.engine`) turns flat values plus a layout into padded tensors and
masks for every path: :class:`BucketCollator`, :class:`PackedCollator`,
:class:`CellCollator`, :meth:`~.device.FlatBatch.finish` and re-padding (:mod:`.repad`).
Every collator implements the collator protocol
(:class:`~shapebucket.plan.ShapedCollator`): ``shapes(sampler)`` and
``repad(batch, shape)``.
"""

from .attention import document_block_mask, document_causal_mask
from .blocks import WithDocumentBlocks, block_mask_from_blocks, document_blocks
from .bucket import BucketCollator
from .cells import CellCollator
from .packed import PackedCollator
from .samples import KeyRoles

__all__ = [
    "BucketCollator",
    "CellCollator",
    "KeyRoles",
    "PackedCollator",
    "WithDocumentBlocks",
    "block_mask_from_blocks",
    "document_block_mask",
    "document_blocks",
    "document_causal_mask",
]

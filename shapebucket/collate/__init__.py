"""Collation: padding batches to their bucket (or packing them), on the host or the device.

One engine (:mod:`.engine`) pads for every path; every collator implements the collator
protocol (:class:`~shapebucket.plan.ShapedCollator`).
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

"""A packed batch's document-mask block structure, made in the DataLoader worker.

:func:`document_blocks` finds what ``create_block_mask`` finds on the step (it depends
only on ``document_ids``) as tensors of static shapes, and :func:`block_mask_from_blocks`
builds the same ``BlockMask`` from them (``BlockMask.from_kv_blocks``) without a pass
over every pair. :class:`WithDocumentBlocks` adds them to each batch of a collator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._validate import check_flag, check_int
from ..errors import ShapeBucketError
from ..plan.contract import check_protocol
from ..plan.shapes import Shape
from .attention import check_document_ids, document_mask_mod

__all__ = [
    "BLOCK_KEYS",
    "CAUSAL_KEY",
    "WithDocumentBlocks",
    "block_mask_from_blocks",
    "document_blocks",
]

#: the names of the four tensors, as ``BlockMask.from_kv_blocks`` takes them
BLOCK_KEYS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
#: the rule the blocks were made with (a bool tensor), beside :data:`BLOCK_KEYS`
CAUSAL_KEY = "causal"


def _ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks per query block and their key-block indices, the used ones first in order
    (the layout ``create_block_mask`` gives ``from_kv_blocks``)."""
    dense = dense.to(torch.int32)
    indices = torch.argsort(dense, dim=-1, descending=True, stable=True)
    return dense.sum(-1).to(torch.int32), indices.to(torch.int32).contiguous()


#: elements of the boolean mask made at once (query blocks are taken in chunks of this)
_CHUNK = 1 << 24


def document_blocks(
    document_ids: torch.Tensor, *, causal: bool = True, block_size: int = 128
) -> dict[str, torch.Tensor]:
    """The block structure of :func:`~shapebucket.document_block_mask`'s mask, as tensors.

    A ``(query block, key block)`` pair is *full* when every pair of tokens in it
    may attend, *partial* when some may; ``kv_num_blocks`` / ``kv_indices`` list the
    partial ones per query block, ``full_kv_*`` the full ones. Made a chunk of query
    blocks at a time (at most 2**24 mask elements); shapes depend only on the batch's
    shape, so batches of one bucket stack and pin alike.

    >>> doc = torch.tensor([[0, 0, 0, 0, 1, 1, -1, -1]])
    >>> blocks = document_blocks(doc, block_size=4)
    >>> blocks["kv_num_blocks"].tolist(), blocks["full_kv_num_blocks"].tolist()
    ([[[1, 1]]], [[[0, 0]]])
    """
    block_size = check_int("block_size", block_size, minimum=1)
    causal = check_flag("causal", causal)
    check_document_ids(document_ids)
    rows, length = document_ids.shape
    n = -(-length // block_size)
    padded = torch.nn.functional.pad(document_ids.cpu(), (0, n * block_size - length), value=-2)
    step = max(1, _CHUNK // max(1, rows * block_size * n * block_size))
    partial, full = [], []
    for i in range(0, n, step):
        allowed = _query_blocks(padded, i, min(n, i + step), block_size, length, causal)
        blocks = allowed.view(rows, -1, block_size, n, block_size)
        some, every = blocks.any(4).any(2), blocks.all(4).all(2)
        partial.append(some & ~every)
        full.append(every)
    kv_num, kv_idx = _ordered(torch.cat(partial, 1)[:, None])
    full_num, full_idx = _ordered(torch.cat(full, 1)[:, None])
    out = dict(zip(BLOCK_KEYS, (kv_num, kv_idx, full_num, full_idx), strict=True))
    out[CAUSAL_KEY] = torch.tensor(causal)  # block_mask_from_blocks checks it against its own
    return {k: v.to(document_ids.device) for k, v in out.items()}


def _query_blocks(
    padded: torch.Tensor, first: int, end: int, block_size: int, length: int, causal: bool
) -> torch.Tensor:
    """``[rows, (end - first) * block_size, n * block_size]``: the mask of query blocks
    ``first`` to ``end``, False outside the batch's length (as ``create_block_mask`` pads
    it), by :func:`~.attention.document_mask_mod`."""
    q_pos = torch.arange(first * block_size, end * block_size)[None, :, None]
    k_pos = torch.arange(padded.shape[1])[None, None, :]
    b = torch.arange(padded.shape[0])[:, None, None]
    allowed = document_mask_mod(padded, causal=causal)(b, None, q_pos, k_pos)
    return allowed & (q_pos < length) & (k_pos < length)


def block_mask_from_blocks(
    blocks: Mapping[str, torch.Tensor],
    document_ids: torch.Tensor,
    *,
    causal: bool = True,
    block_size: int = 128,
) -> Any:
    """The ``BlockMask`` :func:`~shapebucket.document_block_mask` makes, built from
    :func:`document_blocks`' tensors (``BlockMask.from_kv_blocks``) without evaluating
    the mask over every pair; partial blocks still read ``document_ids`` token by token.

    >>> doc = torch.tensor([[0, 0, 0, 0, 1, 1, -1, -1]])
    >>> mask = block_mask_from_blocks(document_blocks(doc, block_size=4), doc, block_size=4)
    >>> mask.shape
    (1, 1, 8, 8)
    """
    from torch.nn.attention.flex_attention import BlockMask

    missing = [k for k in BLOCK_KEYS if k not in blocks]
    if missing:
        raise ShapeBucketError(
            f"blocks lacks {missing}: pass the dict document_blocks(document_ids) returned "
            "(WithDocumentBlocks puts it in the batch)"
        )
    block_size = check_int("block_size", block_size, minimum=1)
    causal = check_flag("causal", causal)
    if CAUSAL_KEY in blocks:
        made = _made_causal(blocks[CAUSAL_KEY])
        if made != causal:
            raise ShapeBucketError(
                f"the blocks were made with causal={made} and block_mask_from_blocks got "
                f"causal={causal}: the mask would list the other rule's blocks; pass the same "
                "causal to both (WithDocumentBlocks(causal=...) or document_blocks(causal=...))"
            )
    check_document_ids(document_ids)
    rows, length = document_ids.shape
    want = (rows, 1, -(-length // block_size))
    got = tuple(getattr(blocks["kv_num_blocks"], "shape", ()))
    if got != want:
        raise ShapeBucketError(
            f"blocks['kv_num_blocks'] has shape {got}, but document_ids {tuple(document_ids.shape)} "
            f"with block_size={block_size} needs {want}: the blocks were made for another batch "
            "or block size; pass the blocks of this batch, made with the same block_size"
        )

    return BlockMask.from_kv_blocks(
        blocks["kv_num_blocks"],
        blocks["kv_indices"],
        blocks["full_kv_num_blocks"],
        blocks["full_kv_indices"],
        BLOCK_SIZE=block_size,
        mask_mod=document_mask_mod(document_ids, causal=causal),
        seq_lengths=(length, length),
    )


def _made_causal(flag: Any) -> bool:
    """The rule ``blocks["causal"]`` records: a bool, or a bool tensor of one value (a
    batch's, or a stack of batches made alike); anything else is refused."""
    if isinstance(flag, bool):
        return flag
    if isinstance(flag, torch.Tensor) and flag.dtype == torch.bool and flag.numel() > 0:
        values = set(flag.flatten().tolist())
        if len(values) == 1:
            return bool(values.pop())
    raise ShapeBucketError(
        f"blocks[{CAUSAL_KEY!r}] must be the bool (or bool tensor of one value) that "
        f"document_blocks records, got {flag!r}: pass the dict document_blocks returned, "
        "unchanged, with blocks made by one rule"
    )


@dataclass(frozen=True)
class WithDocumentBlocks:
    """A collate function: ``collator(samples)`` plus :func:`document_blocks` of its
    ``document_ids`` under ``key`` (a dict of the four block tensors and ``causal``),
    made in the DataLoader worker. Pickles when ``collator`` does.

    >>> from shapebucket.collate.packed import PackedCollator
    >>> collate = WithDocumentBlocks(PackedCollator([8], rows=1, label_shift="none"), block_size=4)
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    >>> batch["document_blocks"]["kv_indices"].shape
    torch.Size([1, 1, 2, 2])
    """

    collator: Any
    block_size: int = 128
    causal: bool = True
    key: str = "document_blocks"
    document_key: str = "document_ids"

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, minimum=1)
        check_flag("causal", self.causal)
        for name in ("key", "document_key"):
            if not isinstance(getattr(self, name), str):
                raise ShapeBucketError(f"{name} must be a str, got {getattr(self, name)!r}")
        if not callable(self.collator):
            raise ShapeBucketError(
                f"WithDocumentBlocks wraps a collate function (a PackedCollator), got "
                f"{type(self.collator).__name__}"
            )

    def __call__(self, samples: Any) -> Any:
        batch = self.collator(samples)
        if not isinstance(batch, Mapping) or self.document_key not in batch:
            raise ShapeBucketError(
                f"WithDocumentBlocks needs batches with {self.document_key!r} (a PackedCollator "
                f"with document_key={self.document_key!r}), got "
                f"{sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__}"
            )
        if self.key in batch:
            raise ShapeBucketError(
                f"the batch already has a key {self.key!r}, where WithDocumentBlocks puts the "
                f"blocks; pass another key= (keys of the batch: {sorted(batch)})"
            )
        return self._with_blocks(batch)

    def _with_blocks(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        blocks = document_blocks(
            batch[self.document_key], causal=self.causal, block_size=self.block_size
        )
        return {**batch, self.key: blocks}

    # -- the collator protocol (shapebucket.plan.ShapedCollator), the wrapped collator's --

    @property
    def packs(self) -> bool:
        """Whether the wrapped collator packs (pairs it with a packed sampler)."""
        check_protocol(self.collator, "WithDocumentBlocks")
        return bool(self.collator.packs)

    @property
    def seq_dim(self) -> int:
        """The wrapped collator's sequence dim."""
        check_protocol(self.collator, "WithDocumentBlocks")
        return int(self.collator.seq_dim)

    def shapes(self, sampler: Any = None) -> frozenset[Shape]:
        """The wrapped collator's shapes (the blocks' shapes follow from each)."""
        check_protocol(self.collator, "WithDocumentBlocks")
        return frozenset(self.collator.shapes(sampler))

    def repad(self, batch: Any, shape: Shape) -> dict[str, Any]:
        """The wrapped collator's ``repad`` of ``batch`` without the blocks, and the blocks
        of the re-padded batch: what this function makes at ``shape``."""
        check_protocol(self.collator, "WithDocumentBlocks")
        if not isinstance(batch, Mapping):
            raise ShapeBucketError(
                f"repad needs a dict batch this collator made, got {type(batch).__name__}"
            )
        inner = self.collator.repad({k: v for k, v in batch.items() if k != self.key}, shape)
        return self._with_blocks(inner)

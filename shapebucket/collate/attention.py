"""Attention masks for packed batches from their ``document_ids``: no token attends across
samples, and a pad token only to itself (no empty softmax row, so no NaN)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = ["document_block_mask", "document_causal_mask"]


def document_causal_mask(document_ids: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
    """A boolean ``[rows, 1, L, L]`` mask for ``scaled_dot_product_attention`` (True: attend).

    >>> doc = torch.tensor([[0, 0, 1, -1]])
    >>> document_causal_mask(doc)[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    """
    check_document_ids(document_ids)
    rows, L = document_ids.shape
    pos = torch.arange(L, device=document_ids.device)
    b = torch.arange(rows, device=document_ids.device)[:, None, None]
    rule = document_mask_mod(document_ids, causal=causal)
    return rule(b, None, pos[None, :, None], pos[None, None, :])[:, None]


def document_block_mask(
    document_ids: torch.Tensor, *, causal: bool = True, block_size: int = 128
) -> Any:
    """The same mask as a ``flex_attention`` ``BlockMask``: blocks that hold no allowed pair
    are skipped, so packed rows cost little more attention than their documents.

    >>> from torch.nn.attention.flex_attention import flex_attention
    >>> doc = torch.tensor([[0, 0, 1, 1, 1, -1, -1, -1]])
    >>> mask = document_block_mask(doc, block_size=8)
    >>> q = torch.randn(1, 1, 8, 4)
    >>> out = flex_attention(q, q, q, block_mask=mask)
    >>> out.shape
    torch.Size([1, 1, 8, 4])
    """
    from torch.nn.attention.flex_attention import create_block_mask

    check_document_ids(document_ids)
    rows, L = document_ids.shape

    return create_block_mask(
        document_mask_mod(document_ids, causal=causal),
        B=rows,
        H=None,
        Q_LEN=L,
        KV_LEN=L,
        device=str(document_ids.device),
        BLOCK_SIZE=block_size,
    )


def document_mask_mod(document_ids: Any, *, causal: bool = True) -> Any:
    """The one rule of every document mask (dense, flex, blocks): ``(b, h, q_idx, kv_idx)``
    may attend when both tokens are of one document (and, when causal, the key is not
    later), or when they are the same token. Indices broadcast, so it also makes dense
    masks."""

    def document_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        dq, dk = document_ids[b, q_idx], document_ids[b, kv_idx]
        allowed = (dq == dk) & (dq >= 0)
        if causal:
            allowed = allowed & (kv_idx <= q_idx)
        return allowed | (q_idx == kv_idx)

    return document_mask


def check_document_ids(document_ids: Any) -> None:
    """Refuse anything but a ``[rows, length]`` tensor of document numbers."""
    if not isinstance(document_ids, torch.Tensor) or document_ids.ndim != 2:
        shape = tuple(document_ids.shape) if hasattr(document_ids, "shape") else type(document_ids)
        raise ShapeBucketError(
            f"document_ids must be a [rows, length] tensor (PackedCollator's document_ids), got "
            f"{shape}; for one row, pass document_ids[None]"
        )
    if 0 in document_ids.shape:
        raise ShapeBucketError(
            f"document_ids has shape {tuple(document_ids.shape)}: no tokens to mask; pass a "
            "packed batch's document_ids (at least one row of at least one token)"
        )

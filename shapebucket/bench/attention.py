"""``--attention``: packed rows through a dense document mask (``sdpa``) or ``flex_attention``
under the document ``BlockMask`` from the collator's blocks (``flex``), refused where this
torch cannot train through it."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from ..collate.blocks import WithDocumentBlocks
from ..errors import ShapeBucketError
from .model import FLEX_BLOCK_SIZE

__all__ = ["add_attention_flag", "check_attention", "with_blocks"]


def add_attention_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attention",
        choices=("sdpa", "flex"),
        default="sdpa",
        help="how packed rows attend: sdpa, a dense document mask (every masked pair "
        "computed), or flex, flex_attention under the document BlockMask built from block "
        "tensors the collator makes (needs flex_attention's backward on --device)",
    )


def check_attention(args: argparse.Namespace) -> None:
    """Refuse ``--attention flex`` where one tiny ``flex_attention`` step cannot run
    forward and backward on ``--device``, naming what torch said and the fix."""
    if getattr(args, "attention", "sdpa") != "flex":
        return
    device = torch.device(args.device)
    try:
        from torch.nn.attention.flex_attention import flex_attention

        q = torch.randn(1, 1, 16, 8, device=device, requires_grad=True)
        flex_attention(q, q, q).sum().backward()  # type: ignore[union-attr]
    except (NotImplementedError, RuntimeError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ShapeBucketError(
            f"--attention flex cannot train on --device {args.device} with torch "
            f"{torch.__version__}: {first}; run it with --device cuda, or leave --attention "
            "sdpa (the dense document mask)"
        ) from None


def with_blocks(collate: Any, attention: str) -> Any:
    """The packed collator, wrapped to add each batch's document blocks under flex."""
    if attention == "flex":
        return WithDocumentBlocks(collate, block_size=FLEX_BLOCK_SIZE)  # the model's BlockMask's
    return collate

"""Small models in plain torch for the steps/sec benchmark and the examples: a GPT-style
decoder, and an encoder-decoder captioner (ViT-style encoder, GPT-style decoder with
cross-attention)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..collate.attention import document_causal_mask
from ..collate.blocks import block_mask_from_blocks

__all__ = ["FLEX_BLOCK_SIZE", "GPT", "CaptionConfig", "Captioner", "GPTConfig"]

#: ``flex_attention``'s block size: a packed batch's ``document_blocks`` are made with it
FLEX_BLOCK_SIZE = 128


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 512
    dim: int = 128
    layers: int = 2
    heads: int = 4
    max_len: int = 256
    mlp_ratio: int = 4


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim),
        )

    def _attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = (
            self.qkv(self.ln1(x)).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        )
        att = _attention(q, k, v, mask)
        return self.proj(att.transpose(1, 2).reshape(B, L, D))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self._attend(x, mask)
        return x + self.mlp(self.ln2(x))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
    """Dense attention under a boolean mask (or none), or ``flex_attention`` under a
    ``BlockMask``: it computes only the blocks the mask keeps."""
    if mask is None or isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=mask)  # type: ignore[return-value]


def _next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the tokens whose label is not -100 (fp32)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


def _causal_padding_mask(attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Causal and padding mask ``[B, 1, L, L]``; a query always sees itself, so a pad row
    never attends to an empty row (which would give NaN)."""
    causal = positions[None, :] <= positions[:, None]
    keys = attention_mask[:, None, None, :].bool() | (positions[None, :] == positions[:, None])
    return causal & keys


class GPT(nn.Module):
    """Pre-norm decoder; ``forward`` returns the mean next-token loss over real tokens.

    The attention mask is causal combined with the padding mask (a query may see
    itself, so pad rows never see an empty row); the loss ignores label -100.
    A packed batch (``position_ids`` and ``document_ids`` from
    :class:`~shapebucket.PackedCollator`) gets each sample's own positions and a
    block-diagonal causal mask (:func:`~shapebucket.document_causal_mask`); with its
    ``document_blocks`` too (:class:`~shapebucket.collate.WithDocumentBlocks`, made in the
    DataLoader worker) it attends through ``flex_attention`` under the document
    ``BlockMask`` (:func:`~shapebucket.collate.block_mask_from_blocks`), computing only the blocks
    the mask keeps.

    >>> model = GPT(GPTConfig(vocab=16, dim=8, layers=1, heads=2, max_len=8))
    >>> ids = torch.randint(0, 16, (2, 8))
    >>> model(ids, ids, torch.ones(2, 8, dtype=torch.bool)).shape
    torch.Size([])
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok, self.pos, self.blocks, self.ln, self.head = _decoder_layers(cfg, Block)

    def logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        document_blocks: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[rows, L, vocab]`` logits of a padded or a packed batch."""
        L = input_ids.shape[1]
        positions = torch.arange(L, device=input_ids.device)
        if document_ids is not None:  # a packed batch (PackedCollator)
            if position_ids is None:
                raise ValueError("a packed batch needs position_ids next to document_ids")
            x = self.tok(input_ids) + self.pos(position_ids)
            mask: Any = (
                document_causal_mask(document_ids)
                if document_blocks is None
                else block_mask_from_blocks(
                    document_blocks, document_ids, block_size=FLEX_BLOCK_SIZE
                )
            )
        else:
            if attention_mask is None:
                raise ValueError("pass attention_mask (padded batches) or document_ids (packed)")
            x = self.tok(input_ids) + self.pos(positions)
            mask = _causal_padding_mask(attention_mask, positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        document_blocks: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        logits = self.logits(input_ids, attention_mask, position_ids, document_ids, document_blocks)
        return _next_token_loss(logits, labels)

    def token_losses(
        self, input_ids: torch.Tensor, labels: torch.Tensor, **inputs: Any
    ) -> torch.Tensor:
        """Per-token cross-entropy ``[rows, L]`` (fp32; 0 where the label is -100)."""
        logits = self.logits(input_ids, **inputs)
        return F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="none"
        ).view(labels.shape)


class CrossBlock(Block):
    """A decoder block: causal self-attention, cross-attention to the image, MLP."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__(cfg)
        self.ln_x = nn.LayerNorm(cfg.dim)
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.kv = nn.Linear(cfg.dim, 2 * cfg.dim)
        self.proj_x = nn.Linear(cfg.dim, cfg.dim)

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, mask: torch.Tensor, memory: torch.Tensor
    ) -> torch.Tensor:
        B, L, D = x.shape
        x = x + self._attend(x, mask)
        H, M = self.heads, memory.shape[1]
        q = self.q(self.ln_x(x)).view(B, L, H, D // H).transpose(1, 2)
        k, v = self.kv(memory).view(B, M, 2, H, D // H).permute(2, 0, 3, 1, 4)
        x = x + self.proj_x(
            F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, D)
        )
        return x + self.mlp(self.ln2(x))


def _decoder_layers(
    cfg: GPTConfig, block: type[Block]
) -> tuple[nn.Embedding, nn.Embedding, nn.ModuleList, nn.LayerNorm, nn.Linear]:
    """A GPT-style decoder's layers, made in this order (the seeded initial weights depend on
    it): token and position embeddings, ``cfg.layers`` blocks, the final norm, the head."""
    return (
        nn.Embedding(cfg.vocab, cfg.dim),
        nn.Embedding(cfg.max_len, cfg.dim),
        nn.ModuleList(block(cfg) for _ in range(cfg.layers)),
        nn.LayerNorm(cfg.dim),
        nn.Linear(cfg.dim, cfg.vocab, bias=False),
    )


@dataclass(frozen=True)
class CaptionConfig(GPTConfig):
    image: int = 32
    patch: int = 8
    channels: int = 3
    encoder_layers: int = 1


class Captioner(nn.Module):
    """A small encoder-decoder: a ViT-style encoder over a fixed-size image and a GPT-style
    decoder with cross-attention over a variable-length caption (the setting of the
    captioning workload). ``forward`` returns the mean next-token loss over real tokens.

    >>> model = Captioner(CaptionConfig(vocab=16, dim=8, layers=1, heads=2, max_len=8, image=8, patch=4))
    >>> ids = torch.randint(0, 16, (2, 5))
    >>> model(torch.zeros(2, 3, 8, 8), ids, ids, torch.ones(2, 5, dtype=torch.bool)).shape
    torch.Size([])
    """

    def __init__(self, cfg: CaptionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        patches = (cfg.image // cfg.patch) ** 2
        self.patchify = nn.Conv2d(cfg.channels, cfg.dim, cfg.patch, stride=cfg.patch)
        self.patch_pos = nn.Parameter(torch.zeros(1, patches, cfg.dim))
        self.encoder = nn.ModuleList(Block(cfg) for _ in range(cfg.encoder_layers))
        self.tok, self.pos, self.decoder, self.ln, self.head = _decoder_layers(cfg, CrossBlock)

    def forward(
        self,
        pixel_values: torch.Tensor,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        memory = self.patchify(pixel_values).flatten(2).transpose(1, 2) + self.patch_pos
        for block in self.encoder:
            memory = block(memory, None)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok(input_ids) + self.pos(positions)
        mask = _causal_padding_mask(attention_mask, positions)
        for block in self.decoder:
            x = block(x, mask, memory)
        return _next_token_loss(self.head(self.ln(x)), labels)

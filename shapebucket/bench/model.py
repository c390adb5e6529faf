"""A small GPT-style decoder in plain torch, for the steps/sec benchmark and examples."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "GPTConfig"]


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = (
            self.qkv(self.ln1(x)).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        )
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(B, L, D))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Pre-norm decoder; ``forward`` returns the mean next-token loss over real tokens.

    The attention mask is causal combined with the padding mask (a query may see
    itself, so pad rows never see an empty row); the loss ignores label -100.

    >>> model = GPT(GPTConfig(vocab=16, dim=8, layers=1, heads=2, max_len=8))
    >>> ids = torch.randint(0, 16, (2, 8))
    >>> model(ids, ids, torch.ones(2, 8, dtype=torch.bool)).shape
    torch.Size([])
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        L = input_ids.shape[1]
        positions = torch.arange(L, device=input_ids.device)
        x = self.tok(input_ids) + self.pos(positions)
        causal = positions[None, :] <= positions[:, None]
        keys = attention_mask[:, None, None, :].bool() | (positions[None, :] == positions[:, None])
        mask = causal & keys
        for block in self.blocks:
            x = block(x, mask)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)

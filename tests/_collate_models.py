"""Models the collation tests feed batches to."""

from __future__ import annotations

import pytest
import torch


def tiny_llama():
    """A tiny Llama (sdpa attention, float32, seeded); skips the calling test when
    transformers is not installed, so the other tests of a file need no extra."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float()

"""The models the BucketedModel tests compare wrapped and unwrapped, and one comparison.

Every model is tiny and built from code (Hugging Face ones from a config: no download).
``compare(name, rows, length, seed)`` runs one random call through the model and through
the wrapped model and returns the largest absolute difference of the outputs, the loss
and every parameter's gradient.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapebucket import BucketedModel

VOCAB = 50
BUCKETS = [8, 16, 32]
ROW_BUCKETS = [2, 4, 8]


class MaskedEncoder(nn.Module):
    """A plain module with a mask: bidirectional attention over the unmasked keys (so a
    pad it could see would change every real token), written by hand (-inf on masked
    scores: a row with no key gives NaN), per-token losses and a mean loss."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        x = self.emb(input_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / 4.0
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask[:, None, :].bool(), float("-inf"))
        x = x + scores.softmax(-1) @ v
        logits = self.out(x)
        out = {"logits": logits}
        if labels is not None:
            losses = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            out["token_losses"] = losses  # [rows, length], 0 where the label is -100
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


class Normed(nn.Module):
    """Token embeddings through a batch norm (its statistics would see a call's pads)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm = nn.Embedding(10, 4), nn.BatchNorm1d(4)

    def forward(self, input_ids, attention_mask=None):
        return self.norm(self.emb(input_ids).transpose(1, 2))


def bench_gpt() -> nn.Module:
    from shapebucket.bench.model import GPT, GPTConfig

    return GPT(GPTConfig(vocab=VOCAB, dim=16, layers=1, heads=2, max_len=64))


def tiny_llama() -> nn.Module:
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        attn_implementation="sdpa",
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def tiny_gpt2() -> nn.Module:
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    return GPT2LMHeadModel(cfg)


def tiny_t5() -> nn.Module:
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        pad_token_id=0,
        decoder_start_token_id=0,
    )
    return T5ForConditionalGeneration(cfg)


BUILDERS = {
    "masked": MaskedEncoder,
    "gpt": bench_gpt,
    "llama": tiny_llama,
    "gpt2": tiny_gpt2,
    "t5": tiny_t5,
}


@functools.cache
def model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return BUILDERS[name]().eval()


def call(name: str, rows: int, length: int, seed: int) -> dict[str, Any]:
    """One call's keyword batch: ids, labels (a few -100), a right-padded mask when the
    model takes one (some rows shorter), a target of another length for the T5."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, length), generator=g)
    labels = ids.clone()
    labels[torch.rand(rows, length, generator=g) < 0.2] = -100
    labels[0] = ids[0]  # some real label in every call (a mean over none is NaN both ways)
    real = torch.randint(1, length + 1, (rows,), generator=g)
    real[0] = length
    mask = (torch.arange(length)[None, :] < real[:, None]).long()
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    if name == "t5":
        target = int(torch.randint(2, 33, (1,), generator=g))
        batch["labels"] = torch.randint(1, VOCAB, (rows, target), generator=g)
    if name == "gpt":
        batch["attention_mask"] = mask.bool()
    return batch


def _tensors(out: Any) -> dict[str, torch.Tensor]:
    """The tensors of an output (a tensor, a dict, a ModelOutput), hidden states included."""
    if isinstance(out, torch.Tensor):
        return {"out": out}
    found = {}
    for k, v in out.items():
        if isinstance(v, torch.Tensor):
            found[k] = v
        elif isinstance(v, tuple) and v and isinstance(v[0], torch.Tensor):
            found.update({f"{k}[{i}]": t for i, t in enumerate(v)})
    return found


def _run(m: nn.Module, batch: dict[str, Any], **extra: Any) -> tuple[dict, dict]:
    m.zero_grad(set_to_none=True)
    out = m(**batch, **extra)
    tensors = _tensors(out)
    loss = tensors.get("loss", tensors.get("out"))
    if loss is None:  # no labels: a scalar of the outputs the caller sees
        loss = tensors["logits"].square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in tensors.items()}, grads


def compare(
    name: str, rows: int, length: int, seed: int, packed: bool = False, **options: Any
) -> dict[str, float]:
    """Largest |wrapped - unwrapped| of outputs, loss and gradients for one random call.
    ``packed``: the call's pads carry label -100 (so the wrapper may pack it). Outputs
    of a call that packed (asked, or by chance) are compared on real positions only (a
    packed call's pad positions hold 0)."""
    inner = model(name)
    batch = call(name, rows, length, seed)
    real = batch["attention_mask"].bool()
    if packed:
        batch["labels"] = batch["labels"].masked_fill(~real, -100)
    if options.get("padding_side") == "left":
        del batch["labels"]  # left padding is for calls without labels (refused with them)
    extra = {"output_hidden_states": True} if name in ("llama", "gpt2", "t5") else {}
    wrapped = BucketedModel(inner, BUCKETS, row_buckets=ROW_BUCKETS, **options)
    want, want_grads = _run(inner, batch, **extra)
    got, got_grads = _run(wrapped, batch, **extra)
    out_diff = 0.0
    # a call whose pads all hold label -100 (by chance too) packs: its pads hold 0
    real_only = packed or wrapped.stats.packed_calls > 0
    for k, v in want.items():
        if k == "past_key_values" or (k not in got and "past" in k):
            continue
        assert got[k].shape == v.shape, (k, got[k].shape, v.shape)
        diff = (got[k] - v).abs()
        if real_only and diff.shape[:2] == real.shape:
            diff = diff[real]
        out_diff = max(out_diff, diff.max().item())
    assert got_grads.keys() == {f"model.{n}" for n in want_grads}
    grad_diff = max((got_grads[f"model.{n}"] - g).abs().max().item() for n, g in want_grads.items())
    loss = next((k for k in ("loss", "out") if k in want), None)
    return {
        "outputs": out_diff,
        "loss": abs(got[loss] - want[loss]).item() if loss else 0.0,
        "grads": grad_diff,
        "nan": float(any(torch.isnan(g).any() for g in got_grads.values())),
        "packed_calls": float(wrapped.stats.packed_calls),
    }

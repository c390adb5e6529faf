"""Every Python block of the README, the guide and the packing page runs as pasted.

The test supplies only what the text says the reader brings: ``lengths`` (one int per
sample), ``ds`` (a dataset of token-id samples) and ``model``, defined once below, a
plain ``nn.Module`` or a Hugging Face decoder. Everything else comes from the blocks
themselves, run in order in one namespace per page. ``torch.compile`` runs with the
eager backend (what is tested is the pipeline, not inductor).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/guide.md", "docs/packing.md", "docs/fit.md", "docs/bucketed.md"]
#: pages whose blocks are alternatives (each runs alone, on a fresh model); the others
#: are steps that build on each other and run in order in one namespace
STANDALONE = {"README.md"}
VOCAB = 50


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)


class TinyLM(nn.Module):
    """A plain module as a reader would write one: takes the keys a batch has by name,
    shifts its labels itself (the Hugging Face convention) and returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.out = nn.Linear(16, VOCAB)

    def forward(
        self, input_ids, labels=None, attention_mask=None, position_ids=None, document_ids=None
    ):
        logits = self.out(self.emb(input_ids))
        if labels is None:
            return logits
        return F.cross_entropy(
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
        )


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    cfg.use_cache = False  # what the README's packing paragraph tells a reader to set
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float()


def dataset(n: int = 96) -> tuple[list[int], list[dict[str, list[int]]]]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 25, (n,), generator=g).tolist()  # 3 buckets: few graphs to trace
    ds = []
    for length in lengths:
        ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
        ds.append({"input_ids": ids, "labels": list(ids)})
    return lengths, ds


def make_model(kind: str) -> nn.Module:
    if kind == "hf":
        pytest.importorskip("transformers")
        return tiny_llama()
    torch.manual_seed(0)
    return TinyLM()


def fresh_namespace(kind: str) -> dict:
    torch._dynamo.reset()
    lengths, ds = dataset()
    return {"lengths": lengths, "ds": ds, "model": make_model(kind)}


def run_page(page: str, kind: str, monkeypatch, each: list | None = None) -> dict:
    """Run the page's blocks; return the namespace of the last one run (and append the
    namespace after each block to ``each``, when given)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python block"
    namespace = fresh_namespace(kind)
    for i, block in enumerate(blocks):
        if page in STANDALONE:
            namespace = fresh_namespace(kind)
        try:
            exec(compile(block, f"{page}[block {i}]", "exec"), namespace)
        except Exception as error:  # name the block that failed
            raise AssertionError(f"{page}, python block {i} failed:\n{block}") from error
        if each is not None:
            each.append(namespace)
    return namespace


@pytest.fixture(scope="module")
def readme_with_hf() -> list[dict]:
    """The README's blocks run once as pasted with the Hugging Face decoder: the namespace
    after each block (each block on a fresh model: they are alternatives). The test of every
    block and the test of the packing block's exactness read the same run."""
    pytest.importorskip("transformers")
    each: list[dict] = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_page("README.md", "hf", monkeypatch, each=each)
    return each


@pytest.mark.parametrize(
    "kind",
    ["plain", pytest.param("hf", marks=pytest.mark.slow)],  # dynamo traces a Llama slowly
)
@pytest.mark.parametrize("page", PAGES)
def test_every_block_runs_as_pasted(page, kind, monkeypatch, request):
    if (page, kind) == ("README.md", "hf"):  # run by the fixture, shared with a later test
        assert len(request.getfixturevalue("readme_with_hf")) == len(python_blocks(page))
        return
    run_page(page, kind, monkeypatch)


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token losses with the Hugging Face shift (logits[t] predicts labels[t + 1])."""
    return F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="none")


def _packed_and_alone(model, batch, ds) -> list[tuple[torch.Tensor, ...]]:
    """(packed logits, alone logits, packed losses, alone losses) of every real sample of
    a packed batch, each sample run alone from its dataset labels."""
    out = model(**{k: v for k, v in batch.items() if k != "labels"})
    logits = out.logits if hasattr(out, "logits") else out
    by_ids = {tuple(s["input_ids"]): s for s in ds}
    pairs = []
    for r in range(batch["input_ids"].shape[0]):
        docs = batch["document_ids"][r]
        for d in sorted(set(docs.tolist()) - {-1}):
            where = (docs == d).nonzero().flatten()
            s, end = int(where[0]), int(where[-1]) + 1
            ids = batch["input_ids"][r, s:end]
            sample = by_ids[tuple(ids.tolist())]
            alone = model(input_ids=ids[None])
            alone = (alone.logits if hasattr(alone, "logits") else alone)[0]
            packed_loss = _token_losses(logits[r, s:end], batch["labels"][r, s:end])
            alone_loss = _token_losses(alone, torch.tensor(sample["labels"]))
            pairs.append((logits[r, s:end], alone, packed_loss, alone_loss))
    return pairs


@pytest.mark.slow
def test_readme_packing_with_a_hugging_face_decoder_equals_one_by_one(readme_with_hf):
    namespace = readme_with_hf[1]  # the packing block, as pasted
    model = namespace["model"]
    batch = next(iter(namespace["loader"]))
    with torch.no_grad():
        pairs = _packed_and_alone(model, batch, namespace["ds"])
    assert int(batch["document_ids"].max()) >= 1  # some row holds several samples
    assert max((a - b).abs().max().item() for a, b, _, _ in pairs) < 1e-5
    assert max((a - b).abs().max().item() for _, _, a, b in pairs) < 1e-5


def test_prewarm_refuses_a_packed_plan_for_a_decoder_that_keeps_a_cache(monkeypatch):
    pytest.importorskip("transformers")
    import shapebucket

    model = tiny_llama()
    model.config.use_cache = True  # Llama's default
    _, ds = dataset(16)
    collate = shapebucket.PackedCollator([64], rows=4, label_shift="model")
    plan = shapebucket.ShapePlan.of(collate)
    with pytest.raises(shapebucket.ShapeBucketError, match="use_cache = False"):
        shapebucket.prewarm(model, plan, example=collate(ds[:3]), progress=False)


def test_a_model_that_does_not_take_a_packed_key_gets_the_fix_not_a_type_error():
    import shapebucket

    class Plain(nn.Module):  # the README's plain module, not packing-aware
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 8)

        def forward(self, input_ids, attention_mask=None, labels=None):
            return self.emb(input_ids).sum()

    _, ds = dataset(8)
    collate = shapebucket.PackedCollator([64], rows=4, label_shift="model")
    plan = shapebucket.ShapePlan.of(collate)
    model = torch.compile(Plain(), backend="eager")
    with pytest.raises(shapebucket.ShapeBucketError, match=r"position_ids.*step="):
        shapebucket.prewarm(model, plan, example=collate(ds[:3]), progress=False)

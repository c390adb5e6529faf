"""``--attention flex``: the bench model's flex path equals its dense-mask path, and the
option is refused where flex_attention cannot train."""

from __future__ import annotations

import pytest
import torch

from shapebucket.bench import cli
from shapebucket.bench.model import FLEX_BLOCK_SIZE, GPT, GPTConfig
from shapebucket.collate.blocks import WithDocumentBlocks
from shapebucket.collate.packed import PackedCollator


def _flex_backward_on_cpu() -> bool:
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    try:
        flex_attention(q, q, q).sum().backward()
    except NotImplementedError:
        return False
    return True


def _packed_batch(rows_len: int = 320) -> dict:
    gen = torch.Generator().manual_seed(0)
    samples = []
    for n in (150, 40, 90, 7, 200, 33):  # documents across block boundaries, and padding
        ids = torch.randint(0, 64, (n,), generator=gen)
        samples.append({"input_ids": ids, "labels": ids})
    collate = WithDocumentBlocks(
        PackedCollator([rows_len], rows=2, mask_key=None, label_shift="none"),
        block_size=FLEX_BLOCK_SIZE,
    )
    return collate(samples)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_path_equals_the_dense_document_mask(dtype):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=64, dim=32, layers=2, heads=4, max_len=512))
    model.eval()
    batch = _packed_batch()
    assert "document_blocks" in batch
    dense_inputs = {k: v for k, v in batch.items() if k not in ("document_blocks", "labels")}
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        flex = model.logits(**dense_inputs, document_blocks=batch["document_blocks"])
        dense = model.logits(**dense_inputs)
    real = batch["document_ids"] >= 0
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(flex[real].float(), dense[real].float(), atol=tol, rtol=tol)


@pytest.mark.skipif(_flex_backward_on_cpu(), reason="this torch trains flex_attention on CPU")
def test_attention_flex_is_refused_where_it_cannot_train(capsys):
    assert cli.main(["--quick", "--attention", "flex", "--json", "", "--plot", ""]) == 2
    err = capsys.readouterr().err
    assert "--attention flex cannot train on --device cpu" in err and "--device cuda" in err

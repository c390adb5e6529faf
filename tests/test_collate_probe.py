"""Issue 22's collation defects, one test each (each fails on commit 18f1347)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shapebucket import BucketCollator, ShapeBucketError, document_block_mask
from shapebucket.collate.kernel import BLOCK, triton_available

# -- 1: truncation cuts the sequence dim whatever holds the values ------------------------------


@pytest.mark.parametrize(
    "wrap",
    [
        lambda a: a.tolist(),
        lambda a: tuple(tuple(r) for r in a.tolist()),
        lambda a: list(a),  # a list of arrays
        lambda a: [torch.from_numpy(r) for r in a],
        lambda a: a,
        torch.from_numpy,
    ],
    ids=["lists", "tuples", "list of arrays", "list of tensors", "array", "tensor"],
)
@pytest.mark.parametrize("side", ["right", "left"])
def test_truncate_with_seq_dim_1_cuts_the_sequence_for_every_container(wrap, side):
    first = np.array([[1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16]])
    second = np.array([[21, 22], [31, 32]])
    collate = BucketCollator([4], seq_dim=1, overflow="truncate", padding_side=side)
    batch = collate([{"x": wrap(first)}, {"x": wrap(second)}])
    kept = first[:, :4] if side == "right" else first[:, 2:]
    short = (
        [[21, 22, 0, 0], [31, 32, 0, 0]] if side == "right" else [[0, 0, 21, 22], [0, 0, 31, 32]]
    )
    assert batch["x"].tolist() == [kept.tolist(), short]
    assert collate.stats.truncated_samples == 1 and collate.stats.truncated_tokens == 2


# -- 3: the kernel's offsets are int64 ---------------------------------------------------------


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (the gpu/test extra)")
@pytest.mark.parametrize("left", [False, True])
def test_kernel_offsets_past_2_32_are_exact(monkeypatch, left):
    """200 rows x 65,536 tokens x 512 features: the last row's elements sit past 2**32.
    The kernel's own offset code, run by the interpreter for one block (the last sample's
    last real token and, with right padding, its first pad), allocates nothing else."""
    from shapebucket.collate import kernel

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows, L, F = 200, 65_536, 512
    lengths = torch.full((rows,), L, dtype=torch.int64)
    lengths[-1] = L - 3  # the last sample is 3 tokens short
    block = (L - 4) * F // BLOCK  # positions L - 4 and L - 3 of the last row
    dst, src = kernel.offsets(lengths, row=rows - 1, block=block, length=L, features=F, left=left)
    e = block * BLOCK + torch.arange(BLOCK, dtype=torch.int64)  # elements of the row
    assert torch.equal(dst, (rows - 1) * L * F + e)
    assert int(dst.min()) > 2**32
    p, f = e // F, e % F
    q = p - 3 if left else p  # the sample's own position
    start = (rows - 1) * L  # tokens of the earlier samples
    real = (q >= 0) & (q < L - 3)
    want = torch.where(real, (start + q) * F + f, torch.full_like(e, -1))
    assert torch.equal(src, want)
    assert int(src[src >= 0].min()) > 2**32 and bool((src == -1).any()) == (not left)


# -- 9: the row mask never replaces the token mask ---------------------------------------------


def test_mask_key_equal_to_sample_mask_key_is_refused():
    with pytest.raises(ShapeBucketError, match="mask_key and sample_mask_key are both"):
        BucketCollator([8], mask_key="m", sample_mask_key="m", rows=3)


# -- low ---------------------------------------------------------------------------------------


def test_document_block_mask_names_a_1d_input():
    with pytest.raises(ShapeBucketError, match=r"\[rows, length\].*document_ids\[None\]"):
        document_block_mask(torch.tensor([0, 0, 1]))


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (the gpu/test extra)")
def test_complex_values_on_the_triton_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    collate = BucketCollator([4], pad_values={"x": 1 + 2j})
    samples = [{"x": torch.tensor([1 + 1j, 2 - 1j])}, {"x": torch.tensor([3j])}]
    got = collate.flat(samples).finish(use_triton=True)["x"]
    assert torch.equal(got, collate(samples)["x"])
    assert got[1].tolist() == [3j, 1 + 2j, 1 + 2j, 1 + 2j]


def test_a_python_float_beyond_float32_is_refused():
    with pytest.raises(ShapeBucketError, match="sample 1: 'x' holds 1e\\+39.*inf.*float64"):
        BucketCollator([4])([{"x": [1.0]}, {"x": [2.0, 1e39]}])
    assert BucketCollator([4])([{"x": [float("inf"), 2.5]}])["x"][0, 0] == float("inf")
    wide = BucketCollator([4])([{"x": np.array([1e39])}])["x"]  # float64 keeps it
    assert wide.dtype == torch.float64 and wide[0, 0] == 1e39


def test_a_ragged_nested_list_is_named():
    with pytest.raises(ShapeBucketError, match="sample 1: 'x' is a ragged nested list"):
        BucketCollator([8], seq_dim=1)([{"x": [[1, 2], [3, 4]]}, {"x": [[1, 2, 3], [4]]}])


def test_the_default_batch_has_no_key_a_model_does_not_take():
    batch = BucketCollator([8], rows=4)([{"input_ids": [1, 2], "labels": [2, 3]}])
    assert set(batch) == {"input_ids", "labels", "attention_mask"}

    def forward(input_ids, attention_mask=None, labels=None):
        return input_ids

    assert forward(**batch).shape == (4, 8)


def test_a_bool_pad_value_for_a_number_key_is_refused():
    """Probe: pad_values={"input_ids": True} padded ids with 1 without a word."""
    from shapebucket import BucketCollator, ShapeBucketError

    with pytest.raises(ShapeBucketError, match=r"pad value True for 'input_ids' is a bool"):
        BucketCollator([8], pad_values={"input_ids": True})([{"input_ids": [1, 2]}])

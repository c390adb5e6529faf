"""Device-side padding: ``collator.flat(samples).finish()`` equals ``collator(samples)``,
exactly, with torch indexing and with the triton kernel (run on CPU by triton's
interpreter, ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapebucket import BucketCollator, ShapeBucketError
from shapebucket.collate.device import FlatBatch
from shapebucket.collate.kernel import triton_available

DTYPES = {
    "int64": (torch.int64, -(2**63), 2**63 - 1),
    "int32": (torch.int32, -(2**31), 2**31 - 1),
    "uint8": (torch.uint8, 0, 255),
    "uint16": (torch.uint16, 0, 2**16 - 1),
    "uint32": (torch.uint32, 0, 2**32 - 1),
    "uint64": (torch.uint64, 0, 2**64 - 1),
    "int8": (torch.int8, -128, 127),
    "bool": (torch.bool, 0, 1),
    "float32": (torch.float32, None, None),
    "float64": (torch.float64, None, None),
    "float16": (torch.float16, None, None),
    "bfloat16": (torch.bfloat16, None, None),
}


@st.composite
def batches(draw):
    name = draw(st.sampled_from(sorted(DTYPES)))
    dtype, lo, hi = DTYPES[name]
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=5))
    trailing = draw(st.sampled_from([(), (3,), (2, 2)]))
    seq_dim = draw(st.sampled_from([0, 1])) if trailing else 0
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    samples = []
    for n in lengths:
        if dtype.is_floating_point:
            v = torch.randn((n, *trailing), generator=g).to(dtype)
        elif dtype == torch.bool:
            v = torch.randint(0, 2, (n, *trailing), generator=g).bool()
        else:  # values across the dtype's range: int64 bits, wrapped to the width
            raw = torch.randint(-(2**63), 2**63 - 1, (n, *trailing), generator=g, dtype=torch.int64)
            v = raw.view(torch.uint64) if dtype == torch.uint64 else raw.to(dtype)
        if seq_dim:
            v = v.movedim(0, 1).contiguous()
        samples.append({"x": v, "idx": len(samples)})
    if dtype == torch.bool:
        pad = draw(st.sampled_from([0, 1]))
    elif dtype.is_floating_point:
        pad = draw(st.sampled_from([0.0, -1.5, 0.1]))
    else:
        pad = draw(st.integers(lo, hi))
    side = draw(st.sampled_from(["right", "left"]))
    rows = draw(st.sampled_from([None, len(lengths) + 2]))
    collate = BucketCollator(
        [4, 8, 16],
        pad_values={"x": pad},
        padding_side=side,
        seq_dim=seq_dim,
        rows=rows,
        sequence_keys=["x"],
    )
    return collate, samples


SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """The same bits in a dtype torch.equal has kernels for."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.view(SIGNED[t.dtype]) if t.dtype in SIGNED else t


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k in want:
        if isinstance(want[k], torch.Tensor):
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            assert got[k].is_contiguous()
            same, ref = _comparable(got[k]), _comparable(want[k])
            assert torch.equal(same, ref), k
        else:
            assert got[k] == want[k], k


@settings(max_examples=150, deadline=None)
@given(batches())
def test_torch_finish_equals_the_collator(case):
    collate, samples = case
    want = collate(samples)
    flat = pickle.loads(pickle.dumps(collate.flat(samples)))  # what a worker sends
    assert_same(flat.finish(use_triton=False), want)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (the gpu/test extra)")
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches())
def test_triton_kernel_equals_the_collator_under_the_interpreter(monkeypatch, case):
    from shapebucket.collate import kernel

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    collate, samples = case
    want = collate(samples)
    flat = collate.flat(samples)
    assert_same(flat.finish(use_triton=True), want)
    if flat.values["x"].numel():  # with no real value there is nothing to move
        assert kernel._kernels.cache_info().currsize >= 1  # the kernel ran, interpreted


def test_flat_counts_the_batch_and_refuses_tuples():
    collate = BucketCollator([8], rows=4)
    flat = collate.flat([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    assert isinstance(flat, FlatBatch)
    assert collate.stats.batches == 1 and collate.stats.padded_tokens == 4 * 8 - 4
    with pytest.raises(ShapeBucketError, match="dict samples"):
        collate.flat([([1, 2],), ([3],)])
    with pytest.raises(ShapeBucketError, match="does not fit"):
        BucketCollator([8], pad_values={"x": 300}).flat([{"x": np.array([1], dtype=np.uint8)}])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_finish_with_triton_equals_the_collator():
    collate = BucketCollator([8, 16], rows=4, pad_values={"labels": -100})
    samples = [
        {"input_ids": torch.randint(0, 100, (n,)), "labels": torch.randint(0, 100, (n,))}
        for n in (3, 16, 7)
    ]
    want = collate(samples)
    got = collate.flat(samples).pin_memory().to("cuda", non_blocking=True).finish()
    assert_same({k: v.cpu() for k, v in got.items()}, want)


def test_finish_refuses_triton_on_cpu_and_a_bad_use_triton(monkeypatch):
    """Probe: finish(use_triton=True) on CPU values (and use_triton='x') raised triton's raw
    RuntimeError '0 active drivers'."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    flat = BucketCollator([8, 16]).flat([{"input_ids": [1, 2]}])
    with pytest.raises(ShapeBucketError, match="use_triton must be True, False or None, got 'x'"):
        flat.finish(use_triton="x")  # type: ignore[arg-type]
    if triton_available():
        with pytest.raises(ShapeBucketError, match="needs the values on a CUDA device"):
            flat.finish(use_triton=True)
    assert flat.finish(use_triton=False)["input_ids"].tolist() == [[1, 2, 0, 0, 0, 0, 0, 0]]


# -- issue 30 defect 8: the grid stays inside CUDA's limits at any size --------------------------

CUDA_AXIS_0, CUDA_AXES_1_2 = 2**31 - 1, 65_535


def _within_cuda_limits(grid: tuple[int, ...]) -> bool:
    return 0 < grid[0] <= CUDA_AXIS_0 and all(0 < g <= CUDA_AXES_1_2 for g in grid[1:])


@pytest.mark.parametrize(
    "rows, elements",
    [
        (8, 16_384 * 4_096),  # [8, 16384, 4096] hidden states: 65,536 blocks a row
        (1, 67_107_840 + 1),  # one element past the old limit of axis 1
        (3, 5),
        (2**20, 2**21 * 1_024),  # 2**31 programs: more than one launch
        (2**16 + 1, 1),  # more rows than axes 1 and 2 allow
    ],
)
def test_launches_cover_every_block_once_within_cuda_limits(rows, elements):
    from shapebucket.collate.kernel import BLOCK, launches

    blocks = -(-elements // BLOCK)
    got = launches(rows, elements)
    assert all(_within_cuda_limits((programs,)) for _, programs in got)
    firsts = [first for first, _ in got]
    assert firsts == [sum(n for _, n in got[:i]) for i in range(len(got))]  # contiguous, in order
    assert sum(n for _, n in got) == rows * blocks


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (the gpu/test extra)")
def test_a_row_past_67_million_elements_launches_within_cuda_limits(monkeypatch):
    """Probe: [8, 16384, 4096] launched the grid (8, 65536), which CUDA refuses (axis 1 is
    capped at 65,535). A stub kernel records the grids pad_rows launches; the output is a
    meta tensor, so nothing of that size is allocated."""
    from shapebucket.collate import kernel

    grids: list[tuple[int, ...]] = []

    class Stub:
        def __getitem__(self, grid):
            grids.append(grid)
            return lambda *args, **kwargs: None

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kernel, "_kernels", lambda interpret: (Stub(), None))
    rows, length, features = 8, 16_384, 4_096
    out = torch.empty((rows, length, features), dtype=torch.float16, device="meta")
    flat = torch.empty((rows * length, features), dtype=torch.float16, device="meta")
    kernel.pad_rows(flat, out, torch.full((rows,), length), left=False)
    assert grids and all(_within_cuda_limits(g) for g in grids)
    assert sum(g[0] for g in grids) == rows * length * features // kernel.BLOCK


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (the gpu/test extra)")
def test_a_grid_split_over_several_launches_pads_exactly(monkeypatch):
    """The interpreter runs the real kernel with at most 3 programs a launch: every block of
    every row is still padded once, at its place."""
    from shapebucket.collate import kernel

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kernel, "MAX_PROGRAMS", 3)
    collate = BucketCollator([4, 8, 700], pad_values={"x": -7}, padding_side="left")
    samples = [{"x": torch.arange(n * 3).reshape(n, 3) + 1} for n in (650, 2, 0, 699)]
    want = collate(samples)
    assert len(kernel.launches(4, 700 * 3)) > 1
    assert_same(collate.flat(samples).finish(use_triton=True), want)

"""Every padding path against a small reference written here in plain Python.

Generated configurations: seq_dim 0-2 with leading and trailing dims, both padding
sides, truncation, values given as lists, tuples, arrays, tensors and lists of
arrays or tensors (mixed per sample), every dtype, pad rows, stacked keys. The paths:
BucketCollator, BucketCollator.flat(...).finish() with torch and with the triton
kernel (run by triton's interpreter), and PackedCollator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapebucket import BucketCollator, PackedCollator
from shapebucket.collate.kernel import triton_available

BUCKETS = [4, 8]
# numpy dtype, torch dtype; list-based containers only for the dtypes Python values have
DTYPES = {
    "int64": (np.int64, torch.int64),
    "int32": (np.int32, torch.int32),
    "int16": (np.int16, torch.int16),
    "int8": (np.int8, torch.int8),
    "uint8": (np.uint8, torch.uint8),
    "uint16": (np.uint16, torch.uint16),
    "uint32": (np.uint32, torch.uint32),
    "uint64": (np.uint64, torch.uint64),
    "bool": (np.bool_, torch.bool),
    "float16": (np.float16, torch.float16),
    "bfloat16": (np.float32, torch.bfloat16),  # values exact in bfloat16, kept as float32
    "float32": (np.float32, torch.float32),
    "float64": (np.float64, torch.float64),
    "complex64": (np.complex64, torch.complex64),
}
PYTHON_TYPED = {"int64", "float32", "bool"}
CONTAINERS = ["array", "tensor", "list", "tuple", "list of arrays", "list of tensors"]


def _values(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    np_dtype, _ = DTYPES[name]
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if name in ("bfloat16", "float16"):
        return rng.integers(-64, 64, shape).astype(np_dtype) / 2
    if name.startswith("float"):
        return rng.standard_normal(shape).astype(np_dtype)
    if name == "complex64":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np_dtype)
    info = np.iinfo(np_dtype)
    return rng.integers(info.min, info.max, shape, dtype=np_dtype, endpoint=True)


def _pad(rng: np.random.Generator, name: str) -> object:
    if name == "bool":
        return bool(rng.integers(0, 2))
    if name.startswith(("float", "bfloat")):
        return float(rng.choice([0.0, -1.5, 7.0]))
    if name == "complex64":
        return 0
    info = np.iinfo(DTYPES[name][0])
    return int(rng.integers(max(info.min, -(2**62)), min(info.max, 2**62), endpoint=True))


def _as(value: np.ndarray, container: str, name: str) -> object:
    """``value`` in ``container``: what the dataset hands the collator."""
    torch_dtype = DTYPES[name][1]
    if container == "array":
        return value
    if container == "tensor":
        return torch.from_numpy(value).to(torch_dtype)
    if value.size == 0 and np.shape(value.tolist()) != value.shape:
        return value  # an empty Python list would lose the dims after the empty one
    if container == "list":
        return value.tolist()
    if container == "tuple":
        return _tuples(value.tolist())
    if value.ndim < 2:
        return value.tolist()
    if container == "list of arrays":
        return list(value)
    return [torch.from_numpy(v) for v in value]


def _tuples(x: object) -> object:
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


@st.composite
def configs(draw, packed: bool = False):
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    seq_dim = draw(st.integers(0, 2))
    lead = tuple(draw(st.lists(st.integers(1, 2), min_size=seq_dim, max_size=seq_dim)))
    trail = draw(st.sampled_from([(), (2,)]))
    truncate = not packed and draw(st.booleans())
    top = 12 if truncate else BUCKETS[-1]
    lens = draw(st.lists(st.integers(1 if packed else 0, top), min_size=1, max_size=4))
    keys = {k: draw(st.sampled_from(sorted(DTYPES))) for k in ("a", "b")}
    canon = {k: [_values(rng, name, (*lead, n, *trail)) for n in lens] for k, name in keys.items()}
    samples = []
    for i in range(len(lens)):
        sample = {}
        for k, name in keys.items():
            choices = CONTAINERS if name in PYTHON_TYPED else ["array", "tensor"]
            if name == "bfloat16":
                choices = ["tensor"]
            sample[k] = _as(canon[k][i], draw(st.sampled_from(choices)), name)
        if not packed:
            sample["n"] = i  # a number: stacked into [rows]
            sample["f"] = torch.full((3,), float(i))  # fixed shape: stacked into [rows, 3]
        samples.append(sample)
    pads = {k: _pad(rng, name) for k, name in keys.items()}
    return {
        "samples": samples,
        "canon": canon,
        "lens": lens,
        "keys": keys,
        "pads": pads,
        "seq_dim": seq_dim,
        "side": "right" if packed else draw(st.sampled_from(["right", "left"])),
        "truncate": truncate,
        "extra_rows": draw(st.sampled_from([None, 0, 2])),
    }


# -- the reference -----------------------------------------------------------------------------


def _empty(c, rows: int, length: int, name: str, pad: object) -> np.ndarray:
    lead, trail = (
        c["canon"]["a"][0].shape[: c["seq_dim"]],
        c["canon"]["a"][0].shape[c["seq_dim"] + 1 :],
    )
    return np.full((rows, length, *lead, *trail), pad, dtype=DTYPES[name][0])


def _place(out: np.ndarray, row: int, at: int, value: np.ndarray, seq_dim: int, first: int, k: int):
    """Tokens ``first .. first + k`` of ``value`` (sequence at ``seq_dim``) at ``at`` of ``row``."""
    tokens = np.moveaxis(value, seq_dim, 0)
    for t in range(k):
        out[row, at + t] = tokens[first + t]


def reference_bucket(c, rows: int | None) -> dict[str, np.ndarray]:
    cut = [min(n, BUCKETS[-1]) for n in c["lens"]]
    L = min(b for b in BUCKETS if b >= max(cut))
    R = rows or len(cut)
    out = {}
    for k, name in c["keys"].items():
        grid = _empty(c, R, L, name, c["pads"][k])
        for i, (n, kept) in enumerate(zip(c["lens"], cut, strict=True)):
            left = c["side"] == "left"
            _place(
                grid,
                i,
                L - kept if left else 0,
                c["canon"][k][i],
                c["seq_dim"],
                n - kept if left else 0,
                kept,
            )
            out[k] = grid
        out[k] = np.moveaxis(grid, 1, c["seq_dim"] + 1)
    out["n"] = np.array(list(range(len(cut))) + [0] * (R - len(cut)))
    out["f"] = np.array(
        [[float(i)] * 3 for i in range(len(cut))] + [[0.0] * 3] * (R - len(cut)), dtype=np.float32
    )
    mask = np.zeros((R, L), dtype=bool)
    for i, kept in enumerate(cut):
        if c["side"] == "left":
            mask[i, L - kept :] = True
        else:
            mask[i, :kept] = True
    out["attention_mask"] = mask
    if rows is not None:
        out["sample_mask"] = np.array([True] * len(cut) + [False] * (R - len(cut)))
    return out


def reference_packed(c, rows: int) -> dict[str, np.ndarray]:
    L = min(b for b in BUCKETS if b >= max(c["lens"]))
    places, row, used = [], 0, 0
    for n in c["lens"]:  # in order; a sample that does not fit starts the next row
        if used + n > L:
            row, used = row + 1, 0
        places.append((row, used))
        used += n
    out = {}
    for k, name in c["keys"].items():
        grid = _empty(c, rows, L, name, c["pads"][k])
        for i, (r, at) in enumerate(places):
            _place(grid, r, at, c["canon"][k][i], c["seq_dim"], 0, c["lens"][i])
        out[k] = np.moveaxis(grid, 1, c["seq_dim"] + 1)
    positions = np.zeros((rows, L), dtype=np.int64)
    documents = np.full((rows, L), -1, dtype=np.int32)
    for i, ((r, at), n) in enumerate(zip(places, c["lens"], strict=True)):
        number = sum(1 for q, _ in places[:i] if q == r)
        for t in range(n):
            positions[r, at + t], documents[r, at + t] = t, number
    out["position_ids"], out["document_ids"] = positions, documents
    return out


def assert_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want), (list(got), list(want))
    for k, ref in want.items():
        t = got[k]
        assert t.is_contiguous() and tuple(t.shape) == ref.shape, (k, t.shape, ref.shape)
        expected = torch.from_numpy(np.ascontiguousarray(ref)).to(t.dtype)
        a, b = (t.float(), expected.float()) if t.dtype == torch.bfloat16 else (t, expected)
        if a.dtype in (torch.uint16, torch.uint32, torch.uint64):
            a, b = (
                a.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]),
                b.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[b.element_size()]),
            )
        assert torch.equal(a, b), k


def _bucket_collator(c) -> tuple[BucketCollator, int | None]:
    rows = None if c["extra_rows"] is None else len(c["lens"]) + c["extra_rows"]
    collate = BucketCollator(
        BUCKETS,
        sequence_keys=["a", "b"],
        pad_values=c["pads"],
        padding_side=c["side"],
        overflow="truncate" if c["truncate"] else "error",
        seq_dim=c["seq_dim"],
        rows=rows,
        sample_mask_key="sample_mask",
    )
    return collate, rows


# -- the paths ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_bucket_collator_and_torch_finish_equal_the_reference(c):
    collate, rows = _bucket_collator(c)
    want = reference_bucket(c, rows)
    assert_equal(collate(c["samples"]), want)
    assert_equal(collate.flat(c["samples"]).finish(use_triton=False), want)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (the gpu/test extra)")
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(configs())
def test_triton_finish_equals_the_reference(monkeypatch, c):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    collate, rows = _bucket_collator(c)
    assert_equal(collate.flat(c["samples"]).finish(use_triton=True), reference_bucket(c, rows))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(packed=True))
def test_packed_collator_equals_the_reference(c):
    want = reference_packed(c, rows=len(c["lens"]) + (c["extra_rows"] or 0))
    collate = PackedCollator(
        BUCKETS, rows=want["a"].shape[0], pad_values=c["pads"], seq_dim=c["seq_dim"]
    )
    assert_equal(collate(c["samples"]), want)

"""Rows calibrated to memory: a binary search over measured whole steps, within the
budget, one more row over it, the state put back bitwise, and a refusal for a length
whose one row does not fit."""

import math
import os
import random
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import BucketBatchSampler, BucketCollator, PackedBatchSampler, ShapeBucketError
from shapebucket.calibrate import calibrate_rows, steady_peak_bytes
from shapebucket.calibrate.memory import live_tensor_bytes, step_peak_bytes
from shapebucket.calibrate.report import size
from shapebucket.calibrate.rows import largest_fitting
from shapebucket.plan import Shape

D = 32
LENGTHS = [16, 32, 64]


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(D, 4 * D), torch.nn.GELU(), torch.nn.Linear(4 * D, D)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step


def make_batch(shape):
    return torch.randn(shape.rows, shape.length, D)


def one_row_peak(length):
    model, opt, step = _setup()
    x = make_batch(Shape(1, length))
    return live_tensor_bytes(model, opt, x, device=x.device) + step_peak_bytes(
        lambda: step(x), x.device
    )


@pytest.fixture(scope="module")
def budget():
    return 8 * one_row_peak(64)


@pytest.fixture(scope="module")
def tight_budget(budget):
    """Three rows' worth at length 64 (about 12 at length 16): a calibration of [16, 64]
    within it measures 6 steps, not the 14 of ``budget``. For the tests of what any
    calibration must leave as it found (state, stderr), which a few steps show."""
    return budget * 3 // 8


@pytest.fixture(scope="module")
def report(budget):
    model, opt, step = _setup()
    return calibrate_rows(model, LENGTHS, budget, make_batch, step=step, restore=[opt], margin=0.1)


@given(answer=st.integers(0, 300), start=st.integers(1, 300), max_rows=st.integers(1, 300))
@settings(max_examples=200, deadline=None)
def test_the_search_is_a_binary_search(answer, start, max_rows):
    start = min(start, max_rows)
    calls = []
    found = largest_fitting(lambda r: calls.append(r) or r <= answer, start, max_rows)
    assert found == min(answer, max_rows)
    assert len(calls) == len(set(calls))  # no row count measured twice
    # a search, not a sweep: logarithmic in the distance from the start to the answer
    assert len(calls) <= 2 * math.ceil(math.log2(abs(start - found) + 1)) + 3


def test_every_length_within_the_limit_and_one_more_row_over(report, budget):
    assert report.limit == int(budget * 0.9)
    assert report.measured == "eager"
    for L in LENGTHS:
        assert report.peak[L] <= report.limit
        assert report.over[L] == report.rows[L] + 1  # bracketed: one more row is over
        assert report.over_peak(L) > report.limit
        # a search, not a sweep: the longest length from 1 row, the others from as many
        # tokens as the next longer one got
        start = report.probes[L][0].rows
        assert start == (1 if L == 64 else report.rows[2 * L] * 2)
        assert (
            len(report.probes[L]) <= 2 * math.ceil(math.log2(abs(report.rows[L] - start) + 1)) + 3
        )
    assert report.rows[16] > report.rows[32] > report.rows[64] >= 1
    assert report.seconds > 0 and "eager" in str(report)


def test_the_chosen_rows_measured_again_stay_within(report):
    for L in LENGTHS:
        model, opt, step = _setup()
        x = torch.randn(report.rows[L], L, D)
        peak = steady_peak_bytes(lambda x=x, step=step: step(x), model, opt, x, device=x.device)
        assert peak <= report.limit


def test_state_is_restored_bitwise(tight_budget):
    model, opt, step = _setup()
    step(torch.randn(2, 8, D))  # the optimizer has state, the RNGs have moved
    params = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()}
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    calibrate_rows(model, [16, 64], tight_budget, make_batch, step=step, restore=[opt])
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    after = opt.state_dict()["state"]
    assert after.keys() == state.keys()
    for k, s in state.items():
        assert all(torch.equal(t, after[k][n]) for n, t in s.items())
    assert torch.equal(torch.get_rng_state(), rng[0])
    assert np.array_equal(np.random.get_state()[1], rng[1]) and random.getstate() == rng[2]
    assert all(p.grad is None for p in model.parameters())


def test_a_length_that_cannot_fit_one_row_is_refused():
    model, opt, step = _setup()
    budget = one_row_peak(64)  # fits 64 x 1 without a margin, not with 10 % off
    with pytest.raises(ShapeBucketError, match=r"length 64: one row peaks at .* over the budget"):
        calibrate_rows(model, [16, 64], budget, make_batch, step=step, restore=[opt])
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"budget": 0}, "budget must be >= 1"),
        ({"budget": 1.5}, r"\(0, 1\]"),
        ({"budget": "1GB"}, r"budget must be a number in \(0, 1\], got '1GB'.*bytes \(an int\)"),
        ({"budget": float("nan")}, r"budget must be a finite number in \(0, 1\], got nan"),
        ({"margin": 1.0}, r"margin must be a finite number in \[0, 1\), got 1.0; margin is"),
        ({"lengths": []}, "lengths is empty"),
        ({"lengths": [0]}, "length must be >= 1"),
        ({"max_rows": 0}, "max_rows must be >= 1"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    model, _, step = _setup()
    args = {"lengths": [16], "budget": 2**20, "margin": 0.1, "max_rows": 8, **kwargs}
    with pytest.raises(ShapeBucketError, match=match):
        calibrate_rows(
            model, args.pop("lengths"), args.pop("budget"), make_batch, step=step, **args
        )


def test_a_fraction_of_memory_and_max_rows():
    model, opt, step = _setup()
    report = calibrate_rows(model, [16], 0.5, make_batch, step=step, restore=[opt], max_rows=4)
    assert report.rows == {16: 4} and report.over == {16: None}
    assert report.budget > 2**20


def test_the_rows_feed_the_samplers_and_collators(report):
    lengths = [random.Random(i).randint(1, 64) for i in range(500)]
    bucket = BucketBatchSampler(lengths, LENGTHS, rows=report.rows, shuffle=False)
    assert bucket.rows == report.rows
    assert {tuple(s) for s in bucket.shapes()} <= set(report.shapes()) | {
        (n, L) for L in LENGTHS for n in range(1, report.rows[L])
    }
    packed = PackedBatchSampler(lengths, LENGTHS, rows=report.rows, shuffle=False)
    assert set(packed.shapes()) <= set(report.shapes())
    assert BucketCollator(LENGTHS, rows=report.rows).rows == report.rows


def test_a_compiled_step_is_reported_as_compiled():
    model, opt, _ = _setup()
    compiled = torch.compile(model, backend="eager", dynamic=False)

    def step(x):
        compiled(x).sum().backward()
        opt.zero_grad(set_to_none=True)

    report = calibrate_rows(compiled, [8], 2**30, make_batch, step=step, restore=[opt], max_rows=2)
    assert report.measured == "compiled" and "compiled its own graph" in report.why


def test_bucket_sampler_takes_rows_per_bucket():
    s = BucketBatchSampler([3, 5, 9, 12, 4], [8, 16], rows={8: 3, 16: 1}, shuffle=False)
    assert list(s) == [[0, 1, 4], [2], [3]] and s.rows == {8: 3, 16: 1}
    with pytest.raises(
        ShapeBucketError,
        match=r"rows has no batch size for buckets \[16\]",
    ):
        BucketBatchSampler([3], [8, 16], rows={8: 3})
    with pytest.raises(ShapeBucketError, match=r"rows\[16\] must be >= 1"):
        BucketBatchSampler([3], [8, 16], rows={8: 3, 16: 0})


@pytest.mark.slow  # measures ~15 whole steps of a GPT through the profiler: 10-20 s here
def test_the_docs_page_runs_as_pasted(capsys):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "calibrate.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/calibrate.md", "exec"), namespace)
    assert "rows within" in capsys.readouterr().out


# -- found by the probe of this round's additions ------------------------------------------


def test_a_batch_that_ignores_its_shape_is_refused_not_measured():
    """A make_batch that always returns one row gave rows=max_rows, silently."""
    lin = torch.nn.Linear(16, 16)
    with pytest.raises(ShapeBucketError, match=r"none has 2 rows at dim 0 and length 8"):
        calibrate_rows(lin, [8], 2**16, lambda s: torch.randn(1, 8, 16), max_rows=512)


def test_the_rng_is_put_back_when_the_first_batch_fails():
    lin = torch.nn.Linear(16, 16)
    state = torch.get_rng_state()

    def bad(shape):
        torch.randn(3)  # draws, then fails
        raise ValueError("no batch")

    with pytest.raises(ValueError, match="no batch"):
        calibrate_rows(lin, [8], 2**16, bad)
    assert torch.equal(state, torch.get_rng_state())


# -- found by the bad-input probe of calibrate_rows -----------------------------------------


def test_an_optimizer_stepped_in_step_and_not_listed_is_put_back(tight_budget):
    """restore=[] while step() steps opt: the probing's moments and step counts stayed."""
    model, opt, step = _setup()
    step(torch.randn(2, 8, D))  # the optimizer has state to keep
    state = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()}
    params = {k: v.clone() for k, v in model.state_dict().items()}
    report = calibrate_rows(model, [16, 64], tight_budget, make_batch, step=step)
    after = opt.state_dict()["state"]
    assert after.keys() == state.keys()
    for k, s in state.items():
        assert all(torch.equal(t, after[k][n]) for n, t in s.items()), k
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    # the step that found the optimizer measured its state copy: it is measured again
    listed = calibrate_rows(model, [16, 64], tight_budget, make_batch, step=step, restore=[opt])
    assert report.rows == listed.rows


@pytest.mark.parametrize(
    "nbytes, said",
    [
        (0, "0 B"),
        (1000, "1000 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (2**20 - 1, "1.0 MiB"),  # not "1024.0 KiB"
        (3 * 2**19, "1.5 MiB"),
        (5 * 2**30, "5.0 GiB"),
        (3 * 2**40, "3072.0 GiB"),
    ],
)
def test_bytes_read_at_every_scale(nbytes, said):
    assert size(nbytes) == said


def test_the_refusal_of_a_small_budget_says_its_bytes():
    """A budget of a few KiB was printed as '0.0 MiB'."""
    model, opt, step = _setup()
    with pytest.raises(ShapeBucketError) as error:
        calibrate_rows(model, [16], 4000, make_batch, step=step, restore=[opt])
    said = str(error.value)
    assert "0.0 MiB" not in said and "budget of 3.9 KiB less the 10% margin (3.5 KiB)" in said
    assert re.search(r"one row peaks at \d+\.\d (KiB|MiB)", said), said


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"make_batch": 3}, r"calibrate_rows: make_batch must be a function Shape -> batch, got 3"),
        ({"make_batch": None}, r"make_batch must be a function Shape -> batch, got None"),
        (
            {"step": "train"},
            r"calibrate_rows: step must be a function batch -> None .* got 'train'",
        ),
        ({"restore": 3}, r"calibrate_rows: restore must be a list .* got 3"),
        ({"restore": [3]}, r"calibrate_rows: cannot snapshot an int \(restore\[0\]\)"),
        ({"model": "gpt", "step": None}, r"calibrate_rows runs model\(\*\*batch\) without a step"),
        ({"model": None, "step": None}, r"calibrate_rows needs a model or a step function"),
    ],
)
def test_wrong_types_are_refused_up_front(kwargs, match):
    model, opt, step = _setup()
    args = {"model": model, "make_batch": make_batch, "step": step, "restore": [opt], **kwargs}
    drawn = torch.get_rng_state()
    with pytest.raises(ShapeBucketError, match=match):
        calibrate_rows(args.pop("model"), [16], 2**20, args.pop("make_batch"), **args)
    assert torch.equal(drawn, torch.get_rng_state())  # refused before any batch was made


def test_a_bare_optimizer_as_restore_is_one_object_as_in_prewarm(budget):
    model, opt, step = _setup()
    step(torch.randn(2, 8, D))
    state = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()}
    calibrate_rows(model, [16], budget, make_batch, step=step, restore=opt, max_rows=4)
    after = opt.state_dict()["state"]
    assert all(torch.equal(t, after[k][n]) for k, s in state.items() for n, t in s.items())


def test_the_shared_checks_name_calibrate_rows():
    """Checks shared with prewarm said 'prewarm' when calibrate_rows ran them."""
    lin = torch.nn.Linear(16, 16)

    def batch(shape):
        return {"input": torch.randn(shape.rows, shape.length, 16), "position_ids": torch.ones(1)}

    with pytest.raises(ShapeBucketError, match=r"^calibrate_rows called model\(\*\*batch\)"):
        calibrate_rows(lin, [8], 2**20, batch, max_rows=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_allocator_peaks_stay_within_and_state_is_put_back():
    device = torch.device("cuda")
    model, opt, step = _setup()
    model.to(device)

    def cuda_batch(shape):
        return torch.randn(shape.rows, shape.length, D, device=device)

    x = cuda_batch(Shape(1, 64))
    budget = 8 * steady_peak_bytes(lambda: step(x), model, opt, x, device=device)
    step(cuda_batch(Shape(2, 8)))  # the optimizer has state
    params = {k: v.clone() for k, v in model.state_dict().items()}
    report = calibrate_rows(
        model, LENGTHS, budget, cuda_batch, step=step, restore=[opt], margin=0.1
    )
    assert report.device.startswith("cuda")
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    for L in LENGTHS:
        assert report.peak[L] <= report.limit < report.over_peak(L)
        x = cuda_batch(Shape(report.rows[L], L))
        again = steady_peak_bytes(lambda x=x: step(x), model, opt, x, device=device)
        assert again <= report.limit  # the allocator agrees when measured again
    assert report.rows[16] > report.rows[32] > report.rows[64] >= 1


def test_the_steady_peak_holds_what_a_first_step_creates():
    """AdamW's two moments exist only after the first step: the steady peak counts them at
    the backward peak (activations far larger than the parameters), the first step's not."""

    def setup():
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)
        )
        opt = torch.optim.AdamW(model.parameters())

        def step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return model, opt, step

    x = torch.randn(4096, 64)
    model, opt, step = setup()
    first = live_tensor_bytes(model, opt, x, device=x.device) + step_peak_bytes(step, x.device)
    model, opt, step = setup()
    steady = steady_peak_bytes(step, model, opt, x, device=x.device)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert steady - first >= 2 * params


def test_steady_peak_bytes_refuses_what_it_cannot_measure():
    with pytest.raises(ShapeBucketError, match="step must be a function"):
        steady_peak_bytes(5, device=torch.device("cpu"))  # type: ignore[arg-type]
    with pytest.raises(ShapeBucketError, match="device must be a torch.device"):
        steady_peak_bytes(lambda: None, device="cpu")  # type: ignore[arg-type]


def test_a_mapping_batch_and_a_sparse_gradient_are_counted():
    """Issue 39 item 13: a tokenizer's BatchEncoding (a Mapping, not a dict) had "no tensor
    in it" for calibrate_rows and 0 bytes for live_tensor_bytes; a sparse embedding's
    gradient raised a raw NotImplementedError (it has no storage)."""
    from collections import UserDict

    from shapebucket.calibrate.memory import live_tensor_bytes
    from shapebucket.calibrate.rows import _device_of

    cpu = torch.device("cpu")
    batch = UserDict({"input_ids": torch.zeros(4, 8, dtype=torch.long)})
    assert live_tensor_bytes(batch, device=cpu) == 4 * 8 * 8
    assert _device_of(batch) == cpu
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2, 2])).sum().backward()
    assert emb.weight.grad is not None and emb.weight.grad.is_sparse
    grad = emb.weight.grad.coalesce()
    expected = 10 * 4 * 4 + grad.indices().nbytes + grad.values().nbytes
    assert live_tensor_bytes(emb, device=cpu) == expected


def test_a_profiler_without_its_raw_events_is_named(monkeypatch):
    """The profiler seam says which torch lacks the undocumented events it reads."""
    import torch.profiler

    class Bare:
        profiler = object()  # no kineto_results: a torch release that renamed it

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.profiler, "profile", Bare)
    with pytest.raises(ShapeBucketError, match=r"kineto_results.*measure on CUDA"):
        step_peak_bytes(lambda: torch.zeros(4), torch.device("cpu"))


def test_calibration_prints_nothing_on_stderr_but_the_step_still_can(tight_budget, capfd):
    """The profiler's start and stop lines (kineto writes them to file descriptor 2) are
    kept out of stderr; what the step itself prints still shows, and so do errors."""
    from shapebucket._torch.profiler import cpu_allocation_peak_bytes

    model, opt, step = _setup()
    calibrate_rows(model, [16, 64], tight_budget, make_batch, step=step, restore=[opt])
    assert capfd.readouterr().err == ""

    def loud():
        torch.zeros(8)
        os.write(2, b"the step's own line\n")

    assert cpu_allocation_peak_bytes(loud) >= 32
    assert capfd.readouterr().err == "the step's own line\n"
    with pytest.raises(RuntimeError, match="boom"):
        cpu_allocation_peak_bytes(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert capfd.readouterr().err == ""  # the profiler stopped quietly; the error raised

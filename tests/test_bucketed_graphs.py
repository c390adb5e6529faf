"""BucketedModel(graphs=True): a planned call under no_grad replays the graph of its padded
shape. On CPU there is no CUDA graph, so these tests replace the capture with an
emulation (its replay runs the model again on the static buffers and writes the result
into the static outputs in place, as a CUDA graph replay does); one CUDA test runs the
real capture."""

from __future__ import annotations

import copy
import math
import pickle

import _bucketed_models as bm
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import BucketedModel, ShapeBucketError
from shapebucket.bucketed import graphs
from shapebucket.bucketed.outputs import leaves

ROW_BUCKETS = bm.ROW_BUCKETS


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(graphs, "capture", graphs.emulated_capture)


def _tensors(out):
    return dict(leaves(out))


def _max_diff(a, b) -> float:
    a, b = _tensors(a), _tensors(b)
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


# -- exact ---------------------------------------------------------------------------------


@settings(max_examples=8, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 8), st.integers(2, 32), st.integers(0, 2**16)),
        min_size=2,
        max_size=8,
    )
)
def test_a_stream_of_graphed_calls_equals_the_unwrapped_calls(shapes):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graphs, "capture", graphs.emulated_capture)
        inner = bm.model("masked")
        wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
        kept = []
        for rows, length, seed in shapes:
            batch = bm.call("masked", rows, length, seed)
            with torch.no_grad():
                want = inner(**batch)
            with torch.inference_mode():
                got = wrapped(**batch)
            assert _max_diff(got, want) <= 1e-5
            kept.append((got, want))
        # every output kept from earlier calls still holds its own call's values
        assert max(_max_diff(g, w) for g, w in kept) <= 1e-5
        assert wrapped.stats.graph_replays == len(shapes)
        assert wrapped.stats.graphs_captured == len(wrapped.stats.shapes)


@settings(max_examples=6, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 6), st.integers(2, 16), st.integers(0, 2**16)),
        min_size=2,
        max_size=6,
    )
)
def test_packed_graphed_calls_equal_the_unwrapped_calls(shapes):
    """The bench GPT takes ``document_ids``: the wrapper packs its calls (real labels only
    on real tokens), and the packed batch is what the graph holds."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graphs, "capture", graphs.emulated_capture)
        inner = bm.model("gpt")
        wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
        for rows, length, seed in shapes:
            batch = bm.call("gpt", rows, length, seed)
            batch["labels"] = batch["labels"].masked_fill(~batch["attention_mask"], -100)
            with torch.no_grad():
                want, got = inner(**batch), wrapped(**batch)
            assert abs(got.item() - want.item()) <= 1e-5
        assert wrapped.stats.packed_calls == len(shapes)
        assert wrapped.stats.graph_replays == len(shapes)
        assert wrapped.stats.graphs_captured == len(wrapped.stats.shapes)


def test_an_output_kept_by_the_caller_is_not_overwritten_by_the_next_call(emulated):
    inner = bm.model("masked")
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    first, second = bm.call("masked", 3, 10, seed=1), bm.call("masked", 3, 10, seed=2)
    with torch.no_grad():
        kept = wrapped(**first)
        before = {k: v.clone() for k, v in kept.items()}
        wrapped(**second)
        want = inner(**first)
    assert wrapped.stats.graphs_captured == 1 and wrapped.stats.graph_replays == 2
    assert all(torch.equal(kept[k], before[k]) for k in kept)
    assert _max_diff(kept, want) <= 1e-5


def test_a_shorter_call_after_a_longer_one_on_the_same_graph_is_exact(emulated):
    """The static buffers hold the longer call's tokens where the shorter call has pads:
    the copy-in writes the whole padded batch, pads included."""
    inner = bm.model("masked")
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    longer, shorter = bm.call("masked", 4, 16, seed=3), bm.call("masked", 3, 9, seed=4)
    with torch.no_grad():
        wrapped(**longer)
        got = wrapped(**shorter)
        want = inner(**shorter)
    assert wrapped.stats.shapes == {(4, 16): 2} and wrapped.stats.graphs_captured == 1
    assert _max_diff(got, want) <= 1e-5


def test_calls_with_grad_enabled_never_replay_and_keep_their_gradients(emulated):
    inner = copy.deepcopy(bm.model("masked"))
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    batch = bm.call("masked", 2, 7, seed=5)
    with torch.no_grad():
        wrapped(**batch)
    out = wrapped(**batch)
    out["loss"].backward()
    assert wrapped.stats.graph_replays == 1 and wrapped.stats.graphs_captured == 1
    assert inner.emb.weight.grad is not None


def test_a_graph_captured_under_inference_mode_replays_under_no_grad(emulated):
    """The static buffers are made outside inference mode: an inference tensor would
    refuse the copy-in of a later call made under ``no_grad``."""
    inner = bm.model("masked")
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    first, second = bm.call("masked", 2, 7, seed=9), bm.call("masked", 2, 6, seed=10)
    with torch.inference_mode():
        wrapped(**first)
    with torch.no_grad():
        got, want = wrapped(**second), inner(**second)
    assert wrapped.stats.graphs_captured == 1 and wrapped.stats.graph_replays == 2
    assert _max_diff(got, want) <= 1e-5


def test_one_capture_per_planned_shape(emulated):
    wrapped = BucketedModel(bm.model("masked"), bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    with torch.no_grad():
        for rows, length in [(1, 5), (2, 8), (3, 9), (4, 16), (1, 3), (8, 30), (5, 20)]:
            wrapped(**bm.call("masked", rows, length, seed=rows))
    assert wrapped.stats.shapes == {(2, 8): 3, (4, 16): 2, (8, 32): 2}
    assert wrapped.stats.graphs_captured == 3 and wrapped.stats.graph_replays == 7


def test_a_copy_of_the_wrapper_starts_without_graphs(emulated):
    wrapped = BucketedModel(bm.model("masked"), bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    batch = bm.call("masked", 2, 6, seed=6)
    with torch.no_grad():
        wrapped(**batch)
        for other in (pickle.loads(pickle.dumps(wrapped)), copy.deepcopy(wrapped)):
            other.stats.graphs_captured = 0
            assert _max_diff(other(**batch), wrapped(**batch)) <= 1e-5
            assert other.stats.graphs_captured == 1  # captured its own


class _Typed(torch.nn.Module):
    """Reads its plain value by type and sign, as Python's ``==`` does not."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4)

    def forward(self, input_ids, attention_mask=None, scale=None):
        x = self.emb(input_ids)
        if scale is True:
            x = x * 2
        if isinstance(scale, float):
            x = x + (100 if math.copysign(1.0, scale) > 0 else -100)
        return x


def test_plain_values_equal_in_python_do_not_share_a_graph(emulated):
    """``1 == True == 1.0`` and ``0.0 == -0.0`` in Python, but the model tells them
    apart: each replays its own graph; a NaN (never equal to itself) keeps one."""
    torch.manual_seed(0)
    inner = _Typed().eval()
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    ids = torch.randint(1, 50, (2, 5))
    with torch.no_grad():
        for scale in (1, True, 1.0, 0, False, 0.0, -0.0):
            got, want = wrapped(input_ids=ids, scale=scale), inner(input_ids=ids, scale=scale)
            assert torch.equal(got, want), scale
        captured = wrapped.stats.graphs_captured
        for _ in range(3):
            wrapped(input_ids=ids, scale=float("nan"))
    assert captured == 7 and wrapped.stats.graphs_captured == 8


class _WritesInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4)

    def forward(self, input_ids, attention_mask=None):
        input_ids.add_(1).remainder_(50)  # in place: the static buffer, in a graph
        return self.emb(input_ids)


def test_a_model_that_writes_into_its_inputs_is_exact_from_the_capturing_call_on(emulated):
    """The capture runs the model on the static buffers before its replay (a CUDA
    capture warms up twice): the replay must start from the call's inputs again."""
    torch.manual_seed(0)
    inner = _WritesInputs().eval()
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    with torch.no_grad():
        for seed in range(3):
            ids = torch.randint(1, 50, (2, 5), generator=torch.Generator().manual_seed(seed))
            assert torch.equal(wrapped(input_ids=ids.clone()), inner(input_ids=ids.clone()))
    assert wrapped.stats.graphs_captured == 1 and wrapped.stats.graph_replays == 3


def test_train_and_eval_mode_each_replay_a_graph_of_their_own(emulated):
    """A graph bakes in what the mode decides (dropout on or off, batch statistics): a
    call after ``train()`` must not replay the graph captured in ``eval()`` mode, nor
    the reverse. (The emulated replay runs the model again, so it would hide a wrong
    replay: the captures are counted.)"""
    torch.manual_seed(0)
    inner = copy.deepcopy(bm.model("masked"))
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    batch = bm.call("masked", 2, 6, seed=11)
    with torch.no_grad():
        for mode in ("eval", "train", "eval", "train"):
            getattr(wrapped, mode)()
            assert _max_diff(wrapped(**batch), inner(**batch)) <= 1e-5
        inner.eval()  # the wrapped module's own mode counts, also set apart from the wrapper
        wrapped(**batch)
    assert wrapped.stats.graphs_captured == 2 and wrapped.stats.graph_replays == 5


def test_a_call_under_autocast_replays_a_graph_of_its_own(emulated):
    """A graph bakes in the dtypes autocast chose at its capture: a call under
    ``torch.autocast`` must not replay the graph captured without it (float32 outputs
    for a bfloat16 call), nor one of another autocast dtype. (The emulated replay runs
    the model again, so the captures are counted.)"""
    inner = bm.model("masked")
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    batch = bm.call("masked", 2, 6, seed=13)
    with torch.no_grad():
        wrapped(**batch)
        for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
            with torch.autocast("cpu", dtype=dtype):
                got, want = wrapped(**batch), inner(**batch)
            assert got["logits"].dtype == want["logits"].dtype == dtype
        wrapped(**batch)
    assert wrapped.stats.graphs_captured == 3 and wrapped.stats.graph_replays == 5


# -- refusals ------------------------------------------------------------------------------


def test_cpu_inputs_are_refused_with_the_fix_without_the_emulation():
    wrapped = BucketedModel(bm.model("masked"), bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    batch = bm.call("masked", 2, 6, seed=7)
    with torch.no_grad(), pytest.raises(ShapeBucketError, match=r"'input_ids'.* is on cpu.*move the model and its inputs to CUDA, or pass graphs=False"):  # fmt: skip
        wrapped(**batch)
    assert wrapped(**batch)["loss"].requires_grad  # grad enabled: today's path, no graph


def test_inputs_on_a_device_without_autocast_are_refused_with_the_fix():
    inner = copy.deepcopy(bm.model("masked")).to("meta")
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    batch = {k: v.to("meta") for k, v in bm.call("masked", 2, 6, seed=7).items()}
    with torch.no_grad(), pytest.raises(ShapeBucketError, match=r"'input_ids'.* is on meta.*move the model and its inputs to CUDA"):  # fmt: skip
        wrapped(**batch)


def test_a_compiled_wrapper_with_graphs_is_refused_with_the_fix(emulated):
    wrapped = BucketedModel(bm.model("masked"), bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    compiled = torch.compile(wrapped, backend="eager")
    with torch.no_grad(), pytest.raises(ShapeBucketError, match=r"BucketedModel\(torch\.compile\(model\), graphs=True\)"):  # fmt: skip
        compiled(**bm.call("masked", 2, 6, seed=8))
    assert wrapped.stats.graphs_captured == 0


def test_a_non_tensor_value_a_graph_would_bake_in_is_refused(emulated):
    class Takes(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, extra=None):
            return input_ids.float()

    wrapped = BucketedModel(Takes(), [8], sequence_keys=["input_ids"], graphs=True)
    with torch.no_grad(), pytest.raises(ShapeBucketError, match=r"'extra' is a list"):
        wrapped(input_ids=torch.ones(1, 3, dtype=torch.long), extra=[torch.ones(1)])


class _Counts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4)

    def forward(self, input_ids, attention_mask=None):
        return {"x": self.emb(input_ids), "real": int(attention_mask.sum())}


def test_a_python_number_in_the_outputs_is_refused_not_replayed_stale(emulated):
    """A replay runs the graph's kernels only: a number the model worked out in Python
    at the capture would come back for every later call of the shape."""
    torch.manual_seed(0)
    inner = _Counts().eval()
    wrapped = BucketedModel(inner, bm.BUCKETS, row_buckets=[4], graphs=True)
    batch = {"input_ids": torch.randint(1, 50, (4, 5)), "attention_mask": torch.ones(4, 5)}
    assert wrapped(**batch)["real"] == 20  # grad enabled: no graph
    with torch.no_grad(), pytest.raises(ShapeBucketError, match=r"output\['real'\] is the int 20, .*\(4, 8\).*return it as a tensor, or pass graphs=False"):  # fmt: skip
        wrapped(**batch)
    assert wrapped.stats.graphs_captured == 0


def test_an_error_raised_by_the_capture_names_the_shape_and_the_fix(monkeypatch):
    """A forward that syncs with the host (``.item()``) fails inside a CUDA capture with
    torch's RuntimeError: it comes back as a ShapeBucketError naming the call's shape,
    the error and the fix, the error as its cause."""

    def failing(fn, static, pool):
        fn(static)  # a warm-up run passes; the capture itself refuses the sync
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "capture", failing)
    wrapped = BucketedModel(bm.model("masked"), bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    with torch.no_grad(), pytest.raises(ShapeBucketError, match=r"capturing the CUDA graph of the call \{'input_ids': \(2, 8\).*RuntimeError: CUDA error: operation not permitted.*graphs=False") as e:  # fmt: skip
        wrapped(**bm.call("masked", 2, 6, seed=12))
    assert isinstance(e.value.__cause__, RuntimeError)
    assert wrapped.stats.graphs_captured == 0


def test_graphs_must_be_a_bool():
    with pytest.raises(ShapeBucketError, match="graphs must be True or False"):
        BucketedModel(bm.model("masked"), bm.BUCKETS, graphs="yes")


# -- CUDA ----------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures a real CUDA graph")
def test_real_capture_of_a_compiled_model_replays_the_unwrapped_outputs():
    inner = copy.deepcopy(bm.model("masked")).cuda()
    wrapped = BucketedModel(torch.compile(inner), bm.BUCKETS, row_buckets=ROW_BUCKETS, graphs=True)
    kept = []
    with torch.inference_mode():
        for rows, length, seed in [(3, 10, 1), (4, 12, 2), (5, 20, 3), (7, 30, 4)]:
            batch = {k: v.cuda() for k, v in bm.call("masked", rows, length, seed).items()}
            got, want = wrapped(**batch), inner(**batch)
            assert _max_diff(got, want) <= 1e-4
            kept.append((got, want))
    assert max(_max_diff(g, w) for g, w in kept) <= 1e-4
    assert wrapped.stats.graphs_captured == 2 and wrapped.stats.graph_replays == 4

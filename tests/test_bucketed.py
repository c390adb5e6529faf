"""BucketedModel: exact (outputs, losses, gradients) for every model the tests build, one
graph per planned shape before or after torch.compile, and every refusal with its reason."""

from __future__ import annotations

import copy
import functools
import pickle
import warnings

import _bucketed_models as bm
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import shapebucket
from shapebucket import BucketedModel, ShapeBucketError
from shapebucket.compile import CompileCounter, Inference

HF = ["llama", "gpt2", "t5"]


def _needs(name: str) -> None:
    if name in HF:
        pytest.importorskip("transformers")


# -- exact ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["masked", "gpt", "llama", "gpt2", "t5"])
@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 8), length=st.integers(2, 32), seed=st.integers(0, 2**16))
def test_wrapped_call_equals_the_unwrapped_call(name, rows, length, seed):
    _needs(name)
    diff = bm.compare(name, rows, length, seed)
    assert diff["nan"] == 0.0
    assert diff["outputs"] <= 1e-5 and diff["loss"] <= 1e-5 and diff["grads"] <= 1e-5, diff


def test_a_call_with_real_labels_on_its_pads_is_padded_not_packed():
    """The unwrapped call's loss counts a label on a pad; a packed call would drop it."""
    gpt = bm.bench_gpt()
    batch = bm.call("gpt", 3, 9, seed=0)  # real labels on the pads of its short rows
    assert (batch["labels"][~batch["attention_mask"]] != -100).any()
    wrapped = BucketedModel(gpt, bm.BUCKETS, row_buckets=bm.ROW_BUCKETS)
    with pytest.warns(UserWarning, match="padded, not packed: it has labels other than -100"):
        assert torch.allclose(wrapped(**batch), gpt(**batch), atol=1e-6)
    assert wrapped.stats.packed_calls == 0 and wrapped.stats.unpacked_calls == 1
    assert wrapped.stats.shapes == {(4, 16): 1}
    batch["labels"] = batch["labels"].masked_fill(~batch["attention_mask"], -100)
    assert torch.allclose(wrapped(**batch), gpt(**batch), atol=1e-6)
    assert wrapped.stats.packed_calls == 1


@pytest.mark.parametrize("name", ["gpt", "llama", "gpt2"])
@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 8), length=st.integers(2, 32), seed=st.integers(0, 2**16))
def test_a_packed_call_equals_the_unwrapped_call_on_real_positions(name, rows, length, seed):
    _needs(name)
    diff = bm.compare(name, rows, length, seed, packed=True)
    assert diff["packed_calls"] == 1.0  # the model takes packed input: the call was packed
    assert diff["nan"] == 0.0
    assert diff["outputs"] <= 1e-5 and diff["loss"] <= 1e-5 and diff["grads"] <= 1e-5, diff


@pytest.mark.parametrize("name", ["llama", "gpt2"])
@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 8), length=st.integers(2, 32), seed=st.integers(0, 2**16))
def test_left_padding_is_exact_for_a_model_that_takes_a_mask(name, rows, length, seed):
    _needs(name)
    diff = bm.compare(name, rows, length, seed, padding_side="left")
    assert max(diff.values()) <= 1e-5, diff


def test_outputs_come_back_at_the_callers_shape_and_pads_are_counted():
    wrapped = BucketedModel(bm.model("masked"), bm.BUCKETS, row_buckets=bm.ROW_BUCKETS)
    out = wrapped(**bm.call("masked", 3, 11, seed=0))
    assert out["logits"].shape == (3, 11, bm.VOCAB)
    assert out["token_losses"].shape == (3, 11) and out["loss"].ndim == 0
    assert wrapped.stats.shapes == {(4, 16): 1}
    assert wrapped.stats.tokens == 33 and wrapped.stats.padded_tokens == 64


def test_positional_arguments_are_named_by_the_models_forward():
    gpt = bm.model("gpt")
    batch = bm.call("gpt", 2, 9, seed=1)
    args = (batch["input_ids"], batch["labels"], batch["attention_mask"])
    wrapped = BucketedModel(gpt, bm.BUCKETS)
    assert torch.allclose(wrapped(*args), gpt(*args), atol=1e-6)


def test_a_plain_function_is_wrapped_too():
    def running_sum(input_ids, attention_mask=None):
        return input_ids.float().cumsum(1) * attention_mask

    wrapped = BucketedModel(running_sum, [8])
    ids = torch.arange(1, 6)[None]
    assert torch.equal(wrapped(ids), running_sum(ids, torch.ones_like(ids)))
    assert wrapped.stats.shapes == {(1, 8): 1}


def test_pixel_values_are_padded_along_rows_only():
    class Captioner(nn.Module):
        def forward(self, input_ids, pixel_values, attention_mask=None):
            self.seen = (tuple(input_ids.shape), tuple(pixel_values.shape))
            return input_ids.float() * pixel_values.mean((1, 2, 3))[:, None]

    inner = Captioner()
    wrapped = BucketedModel(inner, [8], row_buckets=[4])
    ids, pixels = torch.ones(3, 5, dtype=torch.long), torch.rand(3, 3, 5, 5)
    out = wrapped(input_ids=ids, pixel_values=pixels)
    assert inner.seen == ((4, 8), (4, 3, 5, 5))
    assert torch.equal(out, inner(input_ids=ids, pixel_values=pixels))


# -- composes with compile, prewarm, no_recompiles, training ------------------------------


@pytest.mark.parametrize("order", ["wrap compiled", "compile wrapped"])
def test_prewarm_then_no_recompiles_over_random_calls(order, fresh_compiler):
    gpt = bm.bench_gpt()
    if order == "wrap compiled":
        compiled = torch.compile(gpt, backend="eager", dynamic=False)
        model = BucketedModel(compiled, bm.BUCKETS, row_buckets=bm.ROW_BUCKETS)
    else:
        wrapped = BucketedModel(gpt, bm.BUCKETS, row_buckets=bm.ROW_BUCKETS)
        model = torch.compile(wrapped, backend="eager", dynamic=False)
    plan = model.plan(bm.call("gpt", 2, 7, seed=0))
    assert len(plan) == len(bm.BUCKETS) * len(bm.ROW_BUCKETS)
    report = shapebucket.prewarm(model, plan, progress=False)
    assert report.total_graphs == len(plan)
    g = torch.Generator().manual_seed(1)
    with CompileCounter() as cc, shapebucket.no_recompiles(plan):
        for seed in range(25):
            rows, length = (
                int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 9), (2, 33))
            )
            batch = bm.call("gpt", rows, length, seed)
            batch["labels"][~batch["attention_mask"]] = -100  # so every call packs
            assert torch.allclose(model(**batch), gpt(**batch), atol=1e-5)
    # prewarm: a settle run at the smallest shape, then each shape twice (compile, verify)
    assert cc.graphs == 0 and model.stats.packed_calls == 25 + 1 + len(plan) * 2


def test_inference_mode_prewarm_and_calls(fresh_compiler):
    gpt = bm.bench_gpt().eval()
    model = BucketedModel(torch.compile(gpt, backend="eager", dynamic=False), [16, 32])
    example = bm.call("gpt", 2, 5, seed=0)
    plan = model.plan(example)
    shapebucket.prewarm(model, plan, modes=[Inference()], progress=False)
    with torch.inference_mode(), shapebucket.no_recompiles(plan):
        out = model(**bm.call("gpt", 2, 20, seed=3))
    assert out.ndim == 0 and torch.isfinite(out)


def test_training_steps_equal_the_unwrapped_model():
    torch.manual_seed(0)
    plain = bm.MaskedEncoder()
    twin = copy.deepcopy(plain)
    wrapped = BucketedModel(twin, bm.BUCKETS, row_buckets=bm.ROW_BUCKETS)
    # SGD: Adam divides by sqrt(v), so a gradient that is 0 up to float noise (the key
    # bias's, softmax-invariant) would step by lr either way, and the twins drift apart
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (plain, wrapped)]
    for seed, (rows, length) in enumerate([(3, 5), (7, 30), (1, 2), (4, 16)]):
        batch = bm.call("masked", rows, length, seed)
        for m, opt in zip((plain, wrapped), opts, strict=True):
            opt.zero_grad()
            m(**batch)["loss"].backward()
            opt.step()
    for (name, p), q in zip(plain.named_parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5), name


def test_the_wrapper_deep_copies_and_pickles_with_its_own_forward():
    wrapped = BucketedModel(bm.MaskedEncoder(), bm.BUCKETS)
    for twin in (copy.deepcopy(wrapped), pickle.loads(pickle.dumps(wrapped))):
        assert twin.forward.owner is twin
        twin(**bm.call("masked", 2, 5, seed=0))
        assert twin.stats.calls == 1 and wrapped.stats.calls == 0


def test_the_wrapper_shows_the_models_signature_and_attributes():
    import inspect

    llama = (pytest.importorskip("transformers"), bm.model("llama"))[1]
    wrapped = BucketedModel(llama, bm.BUCKETS)
    assert list(inspect.signature(wrapped.forward).parameters)[:3] == [
        "input_ids",
        "attention_mask",
        "position_ids",
    ]
    assert wrapped.config is llama.config


# -- refusals ------------------------------------------------------------------------------


def test_a_call_longer_than_the_largest_bucket_is_refused_naming_both():
    wrapped = BucketedModel(bm.MaskedEncoder(), [8, 16])
    with pytest.raises(ShapeBucketError, match=r"'input_ids' has length 20 > largest bucket 16"):
        wrapped(**bm.call("masked", 2, 20, seed=0))


def test_too_many_rows_are_refused_naming_the_largest_row_bucket():
    wrapped = BucketedModel(bm.MaskedEncoder(), [8], row_buckets=[2, 4])
    with pytest.raises(ShapeBucketError, match=r"5 rows > largest row bucket 4"):
        wrapped(**bm.call("masked", 5, 6, seed=0))


def test_overflow_eager_runs_uncompiled_at_the_calls_shape_and_counts_it(fresh_compiler):
    inner = bm.MaskedEncoder()
    compiled = torch.compile(inner, backend="eager", dynamic=False)
    wrapped = BucketedModel(compiled, [8], overflow="eager")
    plan = wrapped.plan(bm.call("masked", 2, 5, seed=0))
    shapebucket.prewarm(wrapped, plan, progress=False)
    batch = bm.call("masked", 2, 12, seed=0)
    with CompileCounter() as cc, shapebucket.no_recompiles(plan):
        with pytest.warns(UserWarning, match="length 12 .past the largest bucket 8. ran eagerly"):
            out = wrapped(**batch)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once
            wrapped(**batch)
    assert cc.graphs == 0  # never compiled: no graph, no CUDA graph for an unplanned shape
    assert torch.allclose(out["logits"], inner(**batch)["logits"])
    assert wrapped.stats.eager_calls == 2 and wrapped.stats.calls == 2 + 3  # prewarm: settle 1 + 1 + verify 1


def test_only_the_plans_shapes_ever_reach_the_compiler(fresh_compiler):
    """What CUDA graphs would record: a backend that notes every graph's input shapes."""
    seen = set()

    def backend(gm, example_inputs):
        ids = [x for x in example_inputs if x.dtype == torch.long and x.ndim == 2]
        seen.add(tuple(ids[0].shape))  # input_ids (the parameters are float)
        return gm.forward

    gpt = bm.bench_gpt()
    wrapped = BucketedModel(
        torch.compile(gpt, backend=backend, dynamic=False),
        [16, 32],
        row_buckets=[2, 4],
        overflow="eager",
    )
    plan = wrapped.plan(bm.call("gpt", 1, 3, seed=0))
    g = torch.Generator().manual_seed(0)
    for seed in range(30):
        rows = int(torch.randint(1, 7, (1,), generator=g))  # some past the largest row bucket
        wrapped(**bm.call("gpt", rows, int(torch.randint(2, 40, (1,), generator=g)), seed))
    assert seen <= {tuple(s) for s in plan} and wrapped.stats.eager_calls > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_are_recorded_for_the_planned_shapes_only(fresh_compiler):
    from shapebucket.compile import CudaGraphs

    gpt = bm.bench_gpt().cuda()
    compiled = torch.compile(gpt, mode="reduce-overhead", dynamic=False)
    wrapped = BucketedModel(compiled, [16, 32], row_buckets=[2, 4], overflow="eager")
    cuda = {k: v.cuda() for k, v in bm.call("gpt", 1, 3, seed=0).items()}
    plan = wrapped.plan(cuda)
    shapebucket.prewarm(wrapped, plan, modes=[CudaGraphs(), Inference()], progress=False)
    with torch.inference_mode(), CompileCounter() as cc, shapebucket.no_recompiles(plan):
        for seed, (rows, length) in enumerate([(1, 5), (3, 20), (6, 9), (2, 40)]):
            batch = {k: v.cuda() for k, v in bm.call("gpt", rows, length, seed).items()}
            wrapped(**batch)
    assert cc.graphs == 0 and wrapped.stats.eager_calls == 2


def test_left_padding_of_a_model_without_a_mask_or_positions_is_refused():
    class NoMask(nn.Module):
        def forward(self, input_ids):
            return input_ids.float()

    with pytest.raises(ShapeBucketError, match="takes no attention_mask"):
        BucketedModel(NoMask(), [8], padding_side="left")
    # a mask but no position_ids: the model numbers positions itself, so a left pad shifts them
    with pytest.raises(ShapeBucketError, match="takes no position_ids: it numbers positions"):
        BucketedModel(bm.MaskedEncoder(), [8], padding_side="left")


def test_padding_through_batch_norm_in_training_is_refused():
    wrapped = BucketedModel(bm.Normed(), [8], row_buckets=[4])
    with pytest.raises(ShapeBucketError, match="BatchNorm1d and is training"):
        wrapped(input_ids=torch.ones(3, 8, dtype=torch.long))
    wrapped.eval()
    assert wrapped(input_ids=torch.ones(3, 8, dtype=torch.long)).shape == (3, 4, 8)


def test_a_four_dim_mask_and_a_cache_are_refused():
    wrapped = BucketedModel(bm.MaskedEncoder(), [8])
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ShapeBucketError, match="'attention_mask' has shape .2, 1, 5, 5."):
        wrapped(input_ids=ids, attention_mask=torch.ones(2, 1, 5, 5))
    with pytest.raises(ShapeBucketError, match="use_cache=True"):
        wrapped(input_ids=ids, use_cache=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"overflow": "cut"}, "overflow must be .error., .eager. or .dynamic."),
        ({"sequence_keys": "input_ids"}, r"for one key write \['input_ids'\]"),
        ({"padding_side": "middle"}, "padding_side must be 'right' or 'left'"),
        ({"row_buckets": [0]}, "row_buckets"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ShapeBucketError, match=match):
        BucketedModel(bm.MaskedEncoder(), [8], **kwargs)


# -- inside a Hugging Face Trainer -----------------------------------------------------------


def _pad_to_longest(samples):
    """What a reader's collator does with group_by_length: pad to the batch's longest."""
    longest = max(len(s["input_ids"]) for s in samples)
    out = {"input_ids": [], "attention_mask": [], "labels": []}
    for s in samples:
        pad = longest - len(s["input_ids"])
        out["input_ids"].append(s["input_ids"] + [0] * pad)
        out["attention_mask"].append([1] * len(s["input_ids"]) + [0] * pad)
        out["labels"].append(s["input_ids"] + [-100] * pad)
    return {k: torch.tensor(v) for k, v in out.items()}


def _train(model, tmp_path, name):
    from transformers import Trainer, TrainingArguments

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 30, (64,), generator=g).tolist()  # 4 megabatches of 16
    ds = [{"input_ids": torch.randint(1, bm.VOCAB, (n,), generator=g).tolist()} for n in lengths]
    args = TrainingArguments(
        output_dir=str(tmp_path / name),
        per_device_train_batch_size=4,
        max_steps=8,
        logging_steps=1,
        train_sampling_strategy="group_by_length",  # transformers 5: was group_by_length=True
        optim="sgd",
        learning_rate=0.1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=_pad_to_longest)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.slow  # two short Trainer runs: ~6 s
def test_inside_a_trainer_with_group_by_length_it_trains_as_the_plain_model(tmp_path):
    pytest.importorskip("transformers")
    plain, twin = bm.tiny_llama(), bm.tiny_llama()
    twin.load_state_dict(plain.state_dict())
    wrapped = BucketedModel(twin, bm.BUCKETS, row_buckets=bm.ROW_BUCKETS)
    want = _train(plain, tmp_path, "plain")
    got = _train(wrapped, tmp_path, "wrapped")
    assert got == pytest.approx(want, abs=1e-5)
    assert len(got) == 8 and wrapped.stats.calls == 8 and len(wrapped.stats.shapes) >= 2
    for (name, p), q in zip(plain.named_parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5), name


@pytest.mark.slow  # dynamo traces a Llama: ~10 s
def test_the_readmes_block_with_a_hugging_face_model(monkeypatch):
    """README's "Already have a loop?" block as pasted (eager backend), then calls of every
    length of the dataset: the Llama's own logits, and no recompile."""
    pytest.importorskip("transformers")
    import test_docs_code as docs

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    block = next(b for b in docs.python_blocks("README.md") if "BucketedModel" in b)
    namespace = docs.fresh_namespace("hf")
    llama = namespace["model"].eval()
    exec(compile(block, "README.md[BucketedModel]", "exec"), namespace)
    model, ds = namespace["model"], namespace["ds"]
    with shapebucket.no_recompiles(model.plan(namespace["example"])):
        for sample in ds[:12]:
            ids = torch.tensor([sample["input_ids"]])
            got, want = model(input_ids=ids).logits, llama(input_ids=ids).logits
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)


# -- bad settings and calls (probe) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"sequence_keys": 5}, r"sequence_keys must be a non-empty list .* got 5"),
        ({"sequence_keys": []}, r"sequence_keys must be a non-empty list .* got \[\]"),
        ({"sequence_keys": [1]}, r"sequence_keys must be a non-empty list .* got \[1\]"),
        ({"pad_values": [1]}, r"pad_values must be a mapping key -> number, got \[1\]"),
        ({"pad_values": 5}, r"pad_values must be a mapping key -> number, got 5"),
    ],
)
def test_bad_settings_are_refused_naming_them(options, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        BucketedModel(bm.MaskedEncoder(), [8, 16], **options)


def test_a_pad_value_that_does_not_fit_the_calls_dtype_is_refused_not_wrapped():
    def echo(input_ids):
        return input_ids

    wrapped = BucketedModel(echo, [8, 16], pad_values={"input_ids": -1})
    with pytest.raises(ShapeBucketError, match=r"pad value -1 for 'input_ids' .* dtype uint8"):
        wrapped(input_ids=torch.ones(2, 5, dtype=torch.uint8))  # it padded with 255


def test_an_empty_call_is_refused_naming_the_fix_unless_rows_are_padded():
    wrapped = BucketedModel(bm.MaskedEncoder(), [8, 16])
    empty = {"input_ids": torch.ones(0, 5, dtype=torch.long)}
    with pytest.raises(ShapeBucketError, match=r"the call has 0 rows .* pass row_buckets"):
        wrapped(**empty)
    with pytest.raises(ShapeBucketError, match=r"plan\(example\) has 0 rows"):
        wrapped.plan(empty)
    padded = BucketedModel(lambda input_ids: input_ids * 2, [8, 16], row_buckets=[1, 2])
    assert padded(**empty).shape == (0, 5)


def test_a_call_past_the_row_buckets_is_warned_about_naming_the_row_bucket():
    """The warning names the table the call is past: its rows, not its length."""
    wrapped = BucketedModel(bm.MaskedEncoder(), [8], row_buckets=[2], overflow="eager")
    with pytest.warns(UserWarning, match=r"3 rows and length 5 \(past the largest row bucket 2\)") as seen:
        wrapped(**bm.call("masked", 3, 5, seed=0))
    assert wrapped.stats.eager_calls == 1
    assert seen[0].filename == __file__  # the caller's line, not torch's Module.__call__

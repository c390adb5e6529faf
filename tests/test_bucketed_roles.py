"""BucketedModel's roles: inputs by name, outputs learned from the model (never a dim
taken for a length because its size matches), and what it refuses (issue 39, items 1-7)."""

from __future__ import annotations

import dataclasses
import inspect

import _bucketed_models as bm
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from shapebucket import BucketedModel, ShapeBucketError


class Classifier(nn.Module):
    """A sequence classifier: logits ``[rows, labels]``, a pooled ``[rows, width]``."""

    def __init__(self, labels: int, width: int = 8) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(bm.VOCAB, width), nn.Linear(width, labels)

    def forward(self, input_ids, attention_mask=None, labels=None):
        m = attention_mask[..., None].float()
        pooled = (self.emb(input_ids) * m).sum(1) / m.sum(1)
        out = {"logits": self.head(pooled), "pooler_output": pooled}
        if labels is not None:
            out["loss"] = F.mse_loss(out["logits"], labels)
        return out


def _ids(rows, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, bm.VOCAB, (rows, length), generator=g)


@pytest.mark.parametrize("labels", [8, 16, 3])
def test_a_fixed_dim_equal_to_a_bucket_is_never_cut(labels):
    """8 labels in a call padded to bucket 8 (and a pooled width of 8) stay 8."""
    inner = Classifier(labels)
    wrapped = BucketedModel(inner, [8, 16], row_buckets=[4])
    ids = _ids(3, 5)
    out, want = wrapped(input_ids=ids), inner(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert out["logits"].shape == (3, labels) and out["pooler_output"].shape == (3, 8)
    assert torch.allclose(out["logits"], want["logits"], atol=1e-6)


def test_per_row_labels_are_refused_under_row_padding_and_exact_without():
    inner = Classifier(1)
    ids, labels = _ids(3, 5), torch.rand(3, 1)
    with pytest.raises(ShapeBucketError, match=r"'labels' has shape \(3, 1\), one label per row"):
        BucketedModel(inner, [8], row_buckets=[4])(input_ids=ids, labels=labels)
    got = BucketedModel(inner, [8])(input_ids=ids, labels=labels)["loss"]
    want = inner(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)["loss"]
    assert torch.allclose(got, want, atol=1e-6)


def test_a_per_row_tensor_whose_dim_1_equals_the_length_is_padded_along_rows_only():
    seen = {}

    def captioner(input_ids, pixel_values, attention_mask=None):
        seen["pixels"] = tuple(pixel_values.shape)
        return input_ids.float() * pixel_values.mean((1, 2, 3))[:, None]

    wrapped = BucketedModel(captioner, [8], row_buckets=[4])
    ids, pixels = _ids(2, 3), torch.rand(2, 3, 4, 4)  # 3 channels, a call of 3 tokens
    out = wrapped(input_ids=ids, pixel_values=pixels)
    assert seen["pixels"] == (4, 3, 4, 4)
    assert torch.equal(out, captioner(ids, pixels))


def test_only_per_row_features_and_target_keys_pad_the_target():
    """Whisper's shape: input_features [rows, 80, frames] is per-row, the decoder's length pads."""
    seen = {}

    def speech(input_features, decoder_input_ids, decoder_attention_mask=None):
        seen["shapes"] = (tuple(input_features.shape), tuple(decoder_input_ids.shape))
        return decoder_input_ids.float() + input_features.mean((1, 2))[:, None]

    wrapped = BucketedModel(speech, [8, 16])
    feats, dec = torch.rand(2, 80, 30), _ids(2, 5)
    out = wrapped(input_features=feats, decoder_input_ids=dec)
    assert seen["shapes"] == ((2, 80, 30), (2, 8)) and out.shape == (2, 5)


def test_torchs_true_means_pad_masks_are_padded_with_true():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    src = torch.randn(3, 5, 8)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True
    wrapped = BucketedModel(enc, [8], row_buckets=[4])
    got = wrapped(src=src, src_key_padding_mask=pad)
    want = enc(src=src, src_key_padding_mask=pad)
    real = ~pad
    assert got.shape == want.shape and torch.allclose(got[real], want[real], atol=1e-5)


def test_position_ids_of_one_row_broadcast_over_the_rows():
    def model(input_ids, position_ids, attention_mask=None):
        return input_ids.float() + position_ids

    wrapped = BucketedModel(model, [8], row_buckets=[4])
    ids, positions = _ids(3, 5), torch.arange(5)[None]
    assert torch.equal(wrapped(input_ids=ids, position_ids=positions), model(ids, positions))


def test_flat_and_shifted_per_token_outputs_and_dataclass_outputs_are_cut():
    @dataclasses.dataclass
    class Out:
        shifted: torch.Tensor
        flat: torch.Tensor
        attentions: tuple

    def model(input_ids, attention_mask=None):
        x = input_ids.float()
        att = x[:, None, :, None] * x[:, None, None, :]  # [rows, 1, L, L]
        return Out(shifted=x[:, 1:], flat=x.flatten(), attentions=(att,))

    ids = _ids(3, 5)
    got, want = BucketedModel(model, [8, 16], row_buckets=[4])(input_ids=ids), model(ids)
    assert torch.equal(got.shifted, want.shifted) and torch.equal(got.flat, want.flat)
    assert torch.equal(got.attentions[0], want.attentions[0])


def test_an_output_that_follows_neither_rows_nor_a_length_is_refused_by_name():
    def model(input_ids, attention_mask=None):
        return {"real": input_ids[attention_mask.bool()]}  # [real tokens]: content, not shape

    with pytest.raises(ShapeBucketError, match=r"output\['real'\] has size .* follows neither"):
        BucketedModel(model, [8, 16], row_buckets=[4])(input_ids=_ids(3, 5))


def test_a_compiled_model_shows_its_signature_so_the_mask_and_cache_are_added(fresh_compiler):
    seen = {}

    class Model(nn.Module):
        def forward(self, input_ids, attention_mask=None, use_cache=None):
            seen["keys"] = (attention_mask is not None, use_cache)
            return input_ids.float()

    wrapped = BucketedModel(torch.compile(Model(), backend="eager"), [8])
    assert list(inspect.signature(wrapped.forward).parameters) == [
        "input_ids",
        "attention_mask",
        "use_cache",
    ]
    wrapped(_ids(2, 5))  # positional: named by the compiled module's model
    assert seen["keys"] == (True, False)


def test_a_compiled_wrapper_runs_overflowing_calls_eagerly(fresh_compiler):
    inner = bm.MaskedEncoder()
    wrapped = torch.compile(BucketedModel(inner, [8], overflow="eager"), backend="eager")
    batch = bm.call("masked", 2, 12, seed=0)
    with pytest.warns(UserWarning, match="ran eagerly"):
        out = wrapped(**batch)
    assert torch.allclose(out["logits"], inner(**batch)["logits"], atol=1e-6)


class _Mixed(nn.Module):
    """A generated model: token outputs, a fixed-size head of ``fixed`` features, a flat
    per-token output, and a mean loss over token labels."""

    def __init__(self, fixed: int) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(bm.VOCAB, 4), nn.Linear(4, fixed)

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.emb(input_ids) * attention_mask[..., None]
        out = {"hidden": h, "head": self.head(h.sum(1)), "flat": h.sum(-1).flatten()}
        if labels is not None:
            logits = h @ self.emb.weight.T
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 6),
    length=st.integers(2, 16),
    fixed=st.sampled_from([2, 4, 8, 16]),  # 4, 8 and 16 equal a row bucket or a bucket
)
def test_mixed_dims_come_back_exact(rows, length, fixed):
    torch.manual_seed(0)
    inner = _Mixed(fixed)
    ids = _ids(rows, length, seed=rows * 31 + length)
    labels = ids.clone()
    mask = torch.ones_like(ids)
    wrapped = BucketedModel(inner, [8, 16], row_buckets=[4, 8])
    got = wrapped(input_ids=ids, attention_mask=mask, labels=labels)
    got["loss"].backward()
    grads = [p.grad for p in inner.parameters()]
    inner.zero_grad()
    want = inner(input_ids=ids, attention_mask=mask, labels=labels)
    want["loss"].backward()
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert torch.allclose(got[k], want[k], atol=1e-5), k
    for g, p in zip(grads, inner.parameters(), strict=True):
        assert (g is None) == (p.grad is None)
        assert g is None or torch.allclose(g, p.grad, atol=1e-5)


def test_an_eval_mode_batch_norm_model_is_not_refused_by_the_wrappers_own_train_flag():
    inner = bm.Normed().eval()
    wrapped = BucketedModel(inner, [8], row_buckets=[4])  # a new module: training=True
    ids = torch.ones(3, 5, dtype=torch.long)
    assert torch.allclose(wrapped(input_ids=ids), inner(input_ids=ids), atol=1e-6)


def test_the_probe_calls_draw_no_random_number():
    def noisy(input_ids, attention_mask=None):
        return torch.nn.functional.dropout(input_ids.float() + 1, 0.5)

    ids = torch.ones(3, 5, dtype=torch.long)
    learned = BucketedModel(noisy, [8, 16], row_buckets=[4])
    learned(input_ids=ids)  # its output roles are learned: no probe from now on
    fresh = BucketedModel(noisy, [8, 16], row_buckets=[4])
    torch.manual_seed(0)
    want = learned(input_ids=ids)
    torch.manual_seed(0)
    assert torch.equal(fresh(input_ids=ids), want)  # two probe calls ran first


# -- overflow="dynamic" and the measured cut-off ---------------------------------------------


@pytest.fixture
def eager_compile(monkeypatch, fresh_compiler):
    """torch.compile with the eager backend (the dynamic graph compiles fast on a CPU)."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))


def test_overflowing_calls_share_one_dynamic_graph_compiled_once(eager_compile):
    from shapebucket.compile import CompileCounter

    inner = bm.MaskedEncoder()
    wrapped = BucketedModel(inner, [8], overflow="dynamic")
    with CompileCounter() as cc:
        with pytest.warns(UserWarning, match="on the dynamic graph"):
            wrapped(**bm.call("masked", 2, 12, seed=0))
        for rows, length, seed in [(3, 20, 1), (4, 17, 2), (2, 30, 3)]:
            batch = bm.call("masked", rows, length, seed)
            got = wrapped(**batch)["logits"]
            assert torch.allclose(got, inner(**batch)["logits"], atol=1e-5)
    assert cc.graphs == 1 and wrapped.stats.dynamic_calls == 4
    assert wrapped.stats.eager_calls == 0


def _costs(static_per_token: float, dynamic_per_token: float):
    from shapebucket.fit import StepCost

    return (
        StepCost({8: static_per_token, 64: static_per_token}),
        StepCost({8: dynamic_per_token, 64: dynamic_per_token}),
    )


def test_measured_costs_send_calls_that_padding_would_slow_to_the_dynamic_graph(eager_compile):
    batch = bm.call("masked", 2, 9, seed=0)  # 9 pads to 16: 14% more tokens
    inner = bm.MaskedEncoder()
    # a dynamic kernel 1.5x as costly per token: padding 18 -> 32 tokens costs more
    slow_pad = BucketedModel(inner, [8, 16], overflow="dynamic", costs=_costs(1.0, 1.5))
    with pytest.warns(UserWarning, match="dynamic graph"):
        out = slow_pad(**batch)
    assert slow_pad.stats.dynamic_calls == 1
    assert torch.allclose(out["logits"], inner(**batch)["logits"], atol=1e-5)
    # a dynamic kernel 2x as costly: padding is cheaper, the call runs planned
    cheap_pad = BucketedModel(inner, [8, 16], overflow="dynamic", costs=_costs(1.0, 2.0))
    cheap_pad(**batch)
    assert cheap_pad.stats.dynamic_calls == 0 and cheap_pad.stats.shapes == {(2, 16): 1}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"costs": "fast"}, r"costs must be a pair \(static, dynamic\) of StepCost"),
        ({"costs": _costs(1.0, 1.0)}, r"overflow='error' has none; pass overflow='dynamic'"),
        ({"overflow": "fast"}, "overflow must be 'error', 'eager' or 'dynamic'"),
    ],
)
def test_bad_dynamic_settings_are_refused(options, match):
    with pytest.raises(ShapeBucketError, match=match):
        BucketedModel(bm.MaskedEncoder(), [8], **options)


def test_a_wrapper_with_a_dynamic_graph_pickles(eager_compile):
    import pickle

    wrapped = BucketedModel(bm.MaskedEncoder(), [8], overflow="dynamic")
    with pytest.warns(UserWarning):
        wrapped(**bm.call("masked", 2, 12, seed=0))
    twin = pickle.loads(pickle.dumps(wrapped))
    assert twin._dynamic.compiled is None and twin.stats.dynamic_calls == 1


def test_class_labels_of_a_hugging_face_classifier_are_padded_with_minus_100():
    """Integer labels per row, single-label classification: cross-entropy ignores -100,
    so the rows pad exactly (a regression head's or multi-label labels are refused)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=bm.VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(cfg).eval()
    ids, labels = _ids(3, 5), torch.tensor([0, 2, 1])
    wrapped = BucketedModel(bert, [8], row_buckets=[4])
    got = wrapped(input_ids=ids, labels=labels)
    want = bert(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    assert torch.allclose(got.loss, want.loss, atol=1e-5)
    assert torch.allclose(got.logits, want.logits, atol=1e-5)
    cfg.num_labels = 1  # regression: a padded row's label would enter the MSE
    with pytest.raises(ShapeBucketError, match="one label per row"):
        BucketedModel(transformers.BertForSequenceClassification(cfg), [8], row_buckets=[4])(
            input_ids=ids, labels=labels.float()
        )


def test_a_wrappers_plan_pickles_and_makes_the_same_batches():
    """A DataLoader worker or a spawned compile gets the plan pickled (issue 39, item 15)."""
    import pickle

    wrapped = BucketedModel(bm.MaskedEncoder(), [8, 16], row_buckets=[2, 4])
    plan = wrapped.plan(bm.call("masked", 3, 5, seed=0))
    twin = pickle.loads(pickle.dumps(plan))
    assert twin.shapes == plan.shapes
    for shape in plan.shapes:
        a, b = plan.batch(None, shape), twin.batch(None, shape)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

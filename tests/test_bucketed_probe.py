"""Bad and unusual calls of BucketedModel's new parts (issue 36/39 probe): each either
exact on the caller's positions or refused by a ShapeBucketError naming the cause."""

from __future__ import annotations

import pytest
import torch
from _bucketed_models import BUCKETS, ROW_BUCKETS, model
from torch import nn

from shapebucket import BucketedModel
from shapebucket.bucketed import fit_calls
from shapebucket.errors import ShapeBucketError


class _Emb(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 4)


class _ReturnsRows(_Emb):
    def forward(self, input_ids, attention_mask=None):
        return {"x": self.emb(input_ids), "rows": int(input_ids.shape[0])}


class _ReturnsLength(_Emb):
    def forward(self, input_ids, attention_mask=None):
        return self.emb(input_ids), input_ids.shape[1]


class _ReturnsItem(_Emb):
    def forward(self, input_ids, attention_mask=None):
        x = self.emb(input_ids)
        real = int(attention_mask.sum())  # the caller's real tokens: the same padded
        return {"x": x, "real": real, "mean": float((x * attention_mask[..., None]).sum())}


def _wrap(m: nn.Module, **options) -> BucketedModel:
    return BucketedModel(m, BUCKETS, row_buckets=ROW_BUCKETS, **options)


def _call(rows: int = 3, length: int = 5) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 50, (rows, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[1:, length // 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize(
    ("cls", "path"),
    [(_ReturnsRows, r"output\['rows'\] is 2 "), (_ReturnsLength, r"output\[1\] is 8 ")],
)
def test_an_int_output_that_follows_the_shape_is_refused_not_given_back_padded(cls, path):
    torch.manual_seed(0)
    wrapped = _wrap(cls().eval())
    with pytest.raises(ShapeBucketError, match=path + ".*an int that follows the call's shape"):
        wrapped(**_call())


def test_other_numbers_in_the_outputs_come_back_as_the_model_gave_them():
    torch.manual_seed(0)
    inner = _ReturnsItem().eval()
    batch = _call(rows=4)  # no padded rows: their one open mask token would count
    want, got = inner(**batch), _wrap(inner)(**batch)
    assert got["real"] == want["real"]
    assert got["mean"] == pytest.approx(want["mean"], abs=1e-5)
    assert torch.equal(got["x"], want["x"])


@pytest.mark.parametrize("packing", [0, 1, "yes", 1.0])
def test_packing_takes_none_or_a_bool_only(packing):
    with pytest.raises(ShapeBucketError, match="packing must be None, True or False"):
        _wrap(model("llama"), packing=packing)


@pytest.mark.parametrize("packing", [None, False])
@pytest.mark.parametrize("keep", [1, torch.tensor([4])])
def test_logits_to_keep_on_a_right_padded_call_is_refused(packing, keep):
    wrapped = _wrap(model("llama"), packing=packing)
    with pytest.raises(ShapeBucketError, match="logits_to_keep=.*ends in pads.*logits_to_keep=0"):
        wrapped(**_call(), logits_to_keep=keep)


def test_logits_to_keep_padding_left_is_exact():
    inner = model("llama")
    batch = _call()
    batch["attention_mask"] = batch["attention_mask"].flip(1)  # the caller pads left too
    with torch.no_grad():
        want = inner(**batch, logits_to_keep=1).logits
        got = _wrap(inner, padding_side="left")(**batch, logits_to_keep=1).logits
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-5


def test_logits_to_keep_zero_passes():
    inner = model("llama")
    batch = _call()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        want = inner(**batch, logits_to_keep=0).logits
        got = _wrap(inner)(**batch, logits_to_keep=0).logits
    assert (got - want).abs()[real].max().item() < 1e-5


def test_fit_calls_reads_calls_of_inputs_embeds():
    calls = [{"inputs_embeds": torch.ones(r, 5 * r, 16)} for r in (1, 2, 3)]
    shapes = fit_calls(calls, k=1, row_k=1)
    assert shapes.row_buckets == (3,)
    assert list(shapes.buckets) == [16]


def test_a_packed_plan_of_an_example_without_tokens_is_refused():
    plan = _wrap(model("llama")).plan({"input_ids": torch.ones(3, 0, dtype=torch.long)})
    with pytest.raises(ShapeBucketError, match=r"plan\(example\): 'input_ids' has shape \(3, 0\)"):
        plan.batch(None, plan.shapes[0])


def test_a_packed_plan_of_a_left_padded_example_says_packing_false():
    batch = _call()
    batch["attention_mask"] = batch["attention_mask"].flip(1)
    plan = _wrap(model("llama")).plan(batch)
    with pytest.raises(ShapeBucketError, match="not right-padded.*packing=False"):
        plan.batch(None, plan.shapes[0])
    padded = _wrap(model("llama"), packing=False).plan(batch)
    assert padded.batch(None, padded.shapes[0])["input_ids"].shape == (2, 8)


def test_a_model_that_fails_at_the_probe_shapes_is_refused_naming_its_error():
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    inner = GPT2ForSequenceClassification(config).eval()  # no pad_token_id: 1 row only
    one = {"input_ids": torch.randint(1, 50, (1, 5))}
    inner(**one)  # the unwrapped call runs
    wrapped = BucketedModel(inner, BUCKETS)
    with pytest.raises(ShapeBucketError, match=r"probe call .*ValueError: Cannot handle batch"):
        wrapped(**one)


def test_compare_reads_real_positions_of_a_call_that_packs_by_chance():
    """This call's one pad has label -100 by chance, so it packs (pad positions 0)."""
    from _bucketed_models import compare

    diff = compare("llama", 2, 7, 187)
    assert diff["packed_calls"] == 1.0
    assert diff["outputs"] <= 1e-5, diff


def test_a_sequence_key_left_out_of_sequence_keys_is_refused_by_name():
    wrapped = _wrap(model("masked"), sequence_keys=["input_ids"])
    with pytest.raises(ShapeBucketError, match=r"'attention_mask' is a sequence key by name"):
        wrapped(**_call())


def test_sequence_keys_naming_every_sequence_key_is_exact():
    inner = model("masked")
    batch = _call()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        want = inner(**batch)["logits"]
        got = _wrap(inner, sequence_keys=["input_ids", "attention_mask"])(**batch)["logits"]
    assert (got - want).abs()[real].max().item() < 1e-5


def test_a_packed_call_with_a_mask_broadcast_over_its_rows_is_exact():
    """``attention_mask`` of ``[1, length]`` beside ``input_ids`` of ``[rows, length]``
    (the padded path keeps it broadcast): every row has the one mask's real length."""
    inner = model("gpt")
    ids = torch.randint(1, 50, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(10) < 7)[None, :]
    labels = ids.masked_fill(~mask, -100)
    with torch.no_grad():
        want = inner(input_ids=ids, attention_mask=mask, labels=labels)
        wrapped = _wrap(inner)
        got = wrapped(input_ids=ids, attention_mask=mask, labels=labels)
    assert wrapped.stats.packed_calls == 1
    assert abs(got.item() - want.item()) <= 1e-5

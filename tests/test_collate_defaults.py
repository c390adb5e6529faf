"""The collators' defaults on the README's path: a batch feeds ``model(**batch)`` as it is,
a packed batch cannot let a Hugging Face decoder attend across samples, and no default
drops a real label. Each refusal is a ShapeBucketError that names the fix."""

from __future__ import annotations

import pytest
import torch
from _collate_models import tiny_llama
from torch import nn

from shapebucket import BucketBatchSampler, BucketCollator, PackedCollator, ShapeBucketError
from shapebucket.collate import KeyRoles
from shapebucket.fit.packing import pack_rows


class Plain(nn.Module):
    """A model that takes its own inputs and nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.out = nn.Linear(8, 50)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.out(self.emb(input_ids))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(1, 50, (n,), generator=g)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def _quick_start_batch():
    lengths = [3, 5, 9, 12, 4, 7, 15]
    sampler = BucketBatchSampler(lengths, [8, 16], rows=3, shuffle=False)
    collate = BucketCollator([8, 16], rows=sampler.rows)
    samples = _samples(lengths)
    short = next(b for b in sampler if len(b) < 3)  # a batch that gets pad rows
    return collate([samples[i] for i in short]), [samples[i] for i in short]


def test_quick_start_batch_feeds_a_plain_module():
    batch, samples = _quick_start_batch()
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert batch["input_ids"].shape[0] == 3 > len(samples)  # pad rows, and no row-mask key
    model = Plain()
    loss = model(**batch)
    assert torch.isfinite(loss)
    # pad rows change nothing: their labels are all -100
    real = model(**{k: v[: len(samples)] for k, v in batch.items()})
    assert torch.allclose(loss, real)


def test_quick_start_batch_feeds_a_hugging_face_model():
    model = tiny_llama()
    batch, samples = _quick_start_batch()
    with torch.no_grad():
        loss = model(**batch).loss
        real = model(**{k: v[: len(samples)] for k, v in batch.items()}).loss
    assert torch.allclose(loss, real, atol=1e-6)


def test_the_row_mask_is_opt_in_and_never_replaces_the_token_mask():
    samples = [{"input_ids": [1, 2]}]
    assert "sample_mask" not in BucketCollator([8], rows=2)(samples)
    batch = BucketCollator([8], rows=2, sample_mask_key="sample_mask")(samples)
    assert batch["sample_mask"].tolist() == [True, False]
    with pytest.raises(ShapeBucketError, match="mask_key and sample_mask_key are both"):
        BucketCollator([8], mask_key="m", sample_mask_key="m", rows=3)


# -- packing: no attention_mask, ever ----------------------------------------------------------


def test_packed_defaults_carry_no_attention_mask():
    batch = PackedCollator([16], rows=1, label_shift="model")(_samples([3, 5]))
    assert set(batch) == {"input_ids", "labels", "position_ids", "document_ids"}
    with pytest.raises(ShapeBucketError, match="mask_key='token_mask'"):
        PackedCollator([16], rows=1, mask_key="attention_mask")
    tokenized = [dict(s, attention_mask=[1] * len(s["input_ids"])) for s in _samples([3, 5])]
    with pytest.raises(ShapeBucketError, match=r"remove_columns\('attention_mask'\)"):
        PackedCollator([16], rows=1, label_shift="model")(tokenized)
    named = PackedCollator([16], rows=1, label_shift="model", mask_key="token_mask")
    assert named(_samples([3, 5]))["token_mask"].sum() == 8


def test_packed_default_batch_into_a_hugging_face_decoder_equals_one_by_one():
    """model(**batch, use_cache=False) with the default keys (document_ids included):
    the packed losses equal each sample's alone within 1e-5."""
    model = tiny_llama()
    lengths = [5, 17, 3, 9]
    samples = _samples(lengths)
    batch = PackedCollator([32], rows=2, label_shift="model")(samples)
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits
        row, start = pack_rows(lengths, 32)
        for s, r, c, n in zip(samples, row.tolist(), start.tolist(), lengths, strict=True):
            alone = model(input_ids=s["input_ids"][None]).logits[0]
            assert (logits[r, c : c + n] - alone).abs().max() <= 1e-5


# -- labels: the convention is stated ----------------------------------------------------------


def test_labels_need_a_stated_shift():
    samples = _samples([3, 2])
    with pytest.raises(ShapeBucketError, match="label_shift='model'.*label_shift='none'"):
        PackedCollator([8], rows=1)(samples)
    # no labels: nothing to state
    assert "labels" not in PackedCollator([8], rows=1)([{"input_ids": [1, 2]}])
    shifted = PackedCollator([8], rows=1, label_shift="model")(samples)["labels"][0]
    kept = PackedCollator([8], rows=1, label_shift="none")(samples)["labels"][0]
    assert shifted[0] == -100 and shifted[3] == -100 and (kept[:5] != -100).all()


def test_a_label_key_typo_is_refused():
    samples = _samples([3, 2])
    with pytest.raises(ShapeBucketError, match="no key 'label'"):
        PackedCollator([8], rows=1, label_shift="model", roles=KeyRoles(labels=("label",)))(samples)
    both = [dict(s, label=s["labels"]) for s in samples]
    with pytest.raises(ShapeBucketError, match="'labels', which the label keys \\['label'\\]"):
        PackedCollator([8], rows=1, label_shift="model", roles=KeyRoles(labels=("label",)))(both)
    with pytest.raises(ShapeBucketError, match="label_shift"):
        PackedCollator([8], rows=1, roles=KeyRoles(labels=("target",)))(
            [{"input_ids": [1, 2], "target": [2, 3]}]
        )

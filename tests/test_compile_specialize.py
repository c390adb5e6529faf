"""``Specialize()`` over a family of small models fed ``seq_dim=1`` batches (``[B, F, L]``
values and their ``[B, L]`` mask): elementwise, a ``Linear`` over the features, a
convolution over time, attention. Issue #30 defect 3: round 3 tested the elementwise
model only, and a ``Linear`` over the features crashed inside dynamo
(``TensorPropertySource(attention_mask, SIZE, 1) is not in list``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from shapebucket import BucketCollator, ShapeBucketError, ShapePlan, no_recompiles, prewarm
from shapebucket import _torch as compat
from shapebucket.compile import CompileCounter, Specialize
from shapebucket.compile.modes.base import Job
from shapebucket.compile.report import PrewarmReport


class Elementwise(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(features, 1))

    def forward(self, x, attention_mask):
        return (x * self.w * attention_mask[:, None]).sum()


class LinearOverFeatures(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.lin = nn.Linear(features, 4)

    def forward(self, x, attention_mask):
        return (self.lin(x.transpose(1, 2)) * attention_mask[..., None]).sum()


class ConvOverTime(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(features, 4, kernel_size=3, padding=1)

    def forward(self, x, attention_mask):
        return (self.conv(x) * attention_mask[:, None]).sum()


class Attention(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(features, 4), nn.Linear(features, 4)

    def forward(self, x, attention_mask):
        h = x.transpose(1, 2)
        scores = self.q(h) @ self.k(h).transpose(1, 2)
        scores = scores.masked_fill(~attention_mask[:, None, :], -1e4)
        return (scores.softmax(-1) @ h).sum()


MODELS = [Elementwise, LinearOverFeatures, ConvOverTime, Attention]


def batch_of(collate, features, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return collate([{"x": torch.randn(features, n, generator=g)} for n in lengths])


@pytest.mark.parametrize("kind", MODELS, ids=lambda k: k.__name__)
def test_specialize_compiles_every_model_kind_once(kind, fresh_compiler):
    collate = BucketCollator([8, 16, 24], seq_dim=1)
    plan = ShapePlan([(2, b) for b in (8, 16, 24)], collate)
    torch.manual_seed(0)
    model = kind(3)
    compiled = torch.compile(model, dynamic=False, backend="eager")
    report = prewarm(compiled, plan, batch_of(collate, 3, [5, 7], 0), modes=[Specialize()])
    assert set(report.how.values()) == {"specialised"}
    with CompileCounter() as cc, no_recompiles(plan):
        for lengths in ([3, 8], [9, 16], [24, 17]):
            batch = batch_of(collate, 3, lengths, 1)
            assert torch.allclose(compiled(**batch), model(**batch), atol=1e-4)
    assert cc.graphs == 0


@settings(max_examples=16, deadline=None)
@given(
    kind=st.sampled_from(MODELS),
    features=st.integers(2, 5),
    buckets=st.lists(st.sampled_from([4, 8, 12, 16, 24]), min_size=2, max_size=3, unique=True),
    rows=st.integers(2, 3),
    seed=st.integers(0, 2**16),
)
def test_specialize_holds_over_a_family_of_models(kind, features, buckets, rows, seed):
    compat.reset_compiler()
    collate = BucketCollator(sorted(buckets), seq_dim=1)
    plan = ShapePlan([(rows, b) for b in sorted(buckets)], collate)
    torch.manual_seed(seed)
    model = kind(features)
    compiled = torch.compile(model, dynamic=False, backend="eager")
    example = batch_of(collate, features, [3] * rows, seed)
    report = prewarm(compiled, plan, example, modes=[Specialize()], progress=False)
    assert set(report.how.values()) == {"specialised"}
    assert report.total_graphs <= 2  # one trace (and at most one thrown-away try)
    with CompileCounter() as cc, no_recompiles(plan):
        for b in sorted(buckets):  # every planned length, unmarked, from the loader
            batch = batch_of(collate, features, [b - 1] + [2] * (rows - 1), seed + b)
            assert torch.allclose(compiled(**batch), model(**batch), atol=1e-4)
    assert cc.graphs == 0
    compat.reset_compiler()


def test_specialize_names_the_fix_when_no_dim_is_found(monkeypatch):
    collate = BucketCollator([8, 16], seq_dim=1)
    plan = ShapePlan([(2, 8), (2, 16)], collate)
    job = Job(None, None, plan, batch_of(collate, 3, [5, 7], 0), PrewarmReport(plan.shapes))
    mode = Specialize()
    mode.setup(job)
    mode.prepare(job.batch(plan.shapes[0]), plan.shapes[0], job)  # two marked dims
    lost = RuntimeError("TensorPropertySource(base=...) is not in list")
    monkeypatch.setattr(compat, "is_specialization_source_error", lambda e: e is lost)
    assert mode.retry(lost, job) is True  # the predicates go to the second dim
    with pytest.raises(ShapeBucketError, match="found none of the 2 length dims.*without Spec"):
        mode.retry(lost, job)
    assert mode.retry(RuntimeError("another error"), job) is False

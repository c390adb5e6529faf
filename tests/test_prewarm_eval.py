"""Prewarming an evaluation loop (``model.eval()``, ``torch.no_grad()``): prewarm called
under ``torch.no_grad()`` after ``eval()`` compiles the graphs that loop runs (forward
only, nothing requires grad) and puts the eval flag back; ``Inference()`` does the same
for a loop under ``torch.inference_mode()``. The recipe in docs/compile.md."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shapebucket import BucketedModel, ShapeBucketError
from shapebucket.compile import CompileCounter, Inference, no_recompiles, prewarm

pytestmark = pytest.mark.usefixtures("fresh_compiler")
CALLS = [(1, 5), (3, 12), (2, 7), (4, 16), (1, 16)]  # varied rows and lengths


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.drop = nn.Dropout(0.1)  # reads self.training: eval and train are other graphs
        self.out = nn.Linear(8, 50)

    def forward(self, input_ids, attention_mask):
        return self.out(self.drop(self.emb(input_ids)) * attention_mask[..., None])


def call(rows: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.ones(rows, length, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def wrapped() -> BucketedModel:
    torch.manual_seed(0)
    net = torch.compile(Tagger(), backend="eager", dynamic=False)
    return BucketedModel(net, [8, 16], row_buckets=[2, 4])


def test_an_eval_loop_under_no_grad_runs_prewarmed_graphs_only():
    model = wrapped()
    model.eval()  # before prewarm: the graphs are the eval mode's
    plan = model.plan(call(1, 5))  # the keys the loop passes, mask included
    with torch.no_grad():
        report = prewarm(model, plan, progress=False)
    assert report.total_graphs == len(plan) == 4 and not any(report.backward_graphs.values())
    assert not model.training  # put back as it was: eval
    with torch.no_grad(), CompileCounter() as cc, no_recompiles(plan):
        for rows, length in CALLS:
            model(**call(rows, length))
    assert cc.graphs == 0


def test_an_eval_loop_under_inference_mode_with_inference():
    model = wrapped()
    model.eval()
    plan = model.plan(call(1, 5))
    prewarm(model, plan, modes=[Inference()], progress=False)
    with torch.inference_mode(), CompileCounter() as cc, no_recompiles(plan):
        for rows, length in CALLS:
            model(**call(rows, length))
    assert cc.graphs == 0


def test_a_no_grad_loop_after_a_grad_prewarm_names_the_fix():
    model = wrapped()
    model.eval()
    plan = model.plan(call(1, 5))
    prewarm(model, plan, progress=False)  # grad mode on: not the loop's graphs
    with (
        pytest.raises(ShapeBucketError, match=r"with torch.no_grad\(\): prewarm"),
        torch.no_grad(),
        no_recompiles(plan),
    ):
        model(**call(2, 8))

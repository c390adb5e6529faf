"""prewarm compiles the backward of a call whose output is not a scalar loss, and a
backward graph compiled later (AOT autograd compiles it lazily, at the first backward()
through a graph) is seen by ``CompileCounter`` and refused by ``no_recompiles``.

``backend="aot_eager"`` has the lazy backward of inductor without its C++ compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from shapebucket import ShapeBucketError
from shapebucket.compile import CompileCounter, Inference, no_recompiles, prewarm
from shapebucket.compile.calls import backward_outputs
from shapebucket.plan.shapes import ShapePlan

pytestmark = pytest.mark.usefixtures("fresh_compiler")

SHAPES = [(2, 4), (2, 8)]


class Tagger(nn.Module):
    """Per-token logits and a hidden state: no loss, nothing scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.emb(input_ids))
        return {"logits": self.head(hidden), "hidden": hidden, "ids": input_ids}


def plan() -> ShapePlan:
    return ShapePlan.from_function(
        SHAPES, lambda s: {"input_ids": torch.arange(s.rows * s.length).view(s.rows, -1) % 16}
    )


def compiled_tagger() -> tuple[Tagger, nn.Module]:
    torch.manual_seed(0)
    model = Tagger()
    return model, torch.compile(model, backend="aot_eager", dynamic=False)


def train_loop(cmodel: nn.Module) -> None:
    for rows, length in SHAPES:
        out = cmodel(input_ids=torch.ones(rows, length, dtype=torch.long))
        torch.nn.functional.cross_entropy(
            out["logits"].flatten(0, 1), torch.zeros(rows * length, dtype=torch.long)
        ).backward()


def test_prewarm_compiles_the_backward_of_a_non_scalar_output():
    model, cmodel = compiled_tagger()
    report = prewarm(cmodel, plan(), progress=False)
    assert report.backward_graphs == {s: 1 for s in plan()}
    assert all(p.grad is None for p in model.parameters())  # prewarm's grads put back
    with CompileCounter() as cc, no_recompiles(plan()):
        train_loop(cmodel)
    assert (cc.graphs, cc.backward_graphs) == (0, 0)


def test_a_lazy_backward_is_counted_and_refused_inside_no_recompiles():
    _, cmodel = compiled_tagger()
    out = cmodel(input_ids=torch.ones(2, 4, dtype=torch.long))  # forward only, no backward
    with CompileCounter() as cc:
        out["logits"].sum().backward()
    assert cc.backward_graphs == 1 and "1 backward graphs compiled" in str(cc)
    out = cmodel(input_ids=torch.ones(2, 8, dtype=torch.long))
    with (
        pytest.raises(ShapeBucketError, match=r"backward graph compiled inside no_recompiles"),
        no_recompiles(plan()),
    ):
        out["logits"].sum().backward()


def test_no_grad_and_inference_prewarm_forward_only():
    """Under torch.no_grad() (and with Inference()) nothing requires grad: prewarm runs
    forward only, and a no_grad evaluation loop then compiles nothing."""
    _, cmodel = compiled_tagger()
    with torch.no_grad():
        report = prewarm(cmodel, plan(), progress=False)
    assert report.backward_graphs == {s: 0 for s in plan()}
    with torch.no_grad(), CompileCounter() as cc, no_recompiles(plan()):
        for rows, length in SHAPES:
            cmodel(input_ids=torch.ones(rows, length, dtype=torch.long))
    assert cc.graphs == 0
    report = prewarm(cmodel, plan(), modes=[Inference()], progress=False)
    assert report.backward_graphs == {s: 0 for s in plan()}


@dataclasses.dataclass
class Out:
    a: torch.Tensor
    pair: tuple[torch.Tensor, torch.Tensor]


def test_backward_outputs_reaches_every_tensor_that_requires_grad():
    w = torch.ones(3, requires_grad=True)
    frozen = torch.ones(3)
    backward_outputs(Out(a=w * 2, pair=(w * 5, frozen)))
    assert w.grad is not None and w.grad.tolist() == [7.0, 7.0, 7.0]
    w.grad = None
    backward_outputs({"loss": (w * 1).sum(), "logits": w * 100})  # a scalar loss: it alone
    assert w.grad is not None and w.grad.tolist() == [1.0, 1.0, 1.0]
    backward_outputs({"ids": torch.arange(3), "x": frozen * 2})  # nothing requires grad

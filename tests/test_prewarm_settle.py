"""A model that sets its own state in its first call: prewarm runs one call with the
compiler off before compiling, so every graph is compiled in the settled state, and a
recompile on a model attribute names it and the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shapebucket import ShapeBucketError
from shapebucket.compile import CompileCounter, no_recompiles, prewarm
from shapebucket.compile.messages import attribute_change
from shapebucket.plan.shapes import ShapePlan

pytestmark = pytest.mark.usefixtures("fresh_compiler")
EAGER = {"backend": "eager", "dynamic": False}


def tiny_bert_classifier() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=3,
    )
    return transformers.BertForSequenceClassification(cfg)


def bert_batch(rows: int, length: int) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.ones(rows, length, dtype=torch.long),
        "attention_mask": torch.ones(rows, length, dtype=torch.long),
        "labels": torch.zeros(rows, dtype=torch.long),
    }


SHAPES = [(2, 8), (2, 16)]


def test_a_default_bert_classifier_prewarms_and_trains_without_a_recompile():
    """transformers sets config.problem_type in the first call with labels: the first graph
    compiled before it (guarding ``problem_type is None``) failed prewarm's verify pass."""
    model = tiny_bert_classifier()
    assert model.config.problem_type is None
    cmodel = torch.compile(model, **EAGER)
    plan = ShapePlan.from_function(SHAPES, lambda s: bert_batch(s.rows, s.length))
    report = prewarm(cmodel, plan, progress=False)
    assert report.total_graphs == 2
    assert model.config.problem_type == "single_label_classification"  # settled, as a loop would
    with CompileCounter() as cc, no_recompiles(plan):
        for rows, length in [*SHAPES, *SHAPES]:
            cmodel(**bert_batch(rows, length)).loss.backward()
    assert cc.graphs == 0


def test_a_recompile_on_config_problem_type_names_it_and_the_fix():
    cmodel = torch.compile(tiny_bert_classifier(), **EAGER)
    cmodel(**bert_batch(2, 8))  # compiled with problem_type None; the call sets it
    with (
        pytest.raises(ShapeBucketError, match="model attribute changed by a call") as error,
        no_recompiles(),
    ):
        cmodel(**bert_batch(2, 8))
    assert 'model.config.problem_type = "single_label_classification"' in str(error.value)
    assert "other inputs" not in str(error.value)


class SetsAFlag(nn.Module):
    """Sets a public module attribute in its first call, which prewarm puts back."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.ready = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ready:
            self.ready = True
        return self.lin(x).sum()


def test_an_attribute_prewarm_puts_back_is_named_by_the_verify_pass():
    """Before the settle run, verify replayed the first call's change and passed; the loop's
    second call of the first shape then recompiled."""
    model = SetsAFlag()
    plan = ShapePlan.from_function([(2, 4), (3, 4)], lambda s: torch.ones(s.rows, s.length))
    with pytest.raises(ShapeBucketError, match=r"model attribute changed by a call \(model\.ready"):
        prewarm(torch.compile(model, **EAGER), plan, progress=False)
    assert model.ready is False  # put back, also on error
    model.ready = True  # the fix the message gives
    torch.compiler.reset()
    cmodel = torch.compile(model, **EAGER)
    prewarm(cmodel, plan, progress=False)
    with no_recompiles(plan):
        for rows in (2, 3, 2):
            cmodel(torch.ones(rows, 4))


def test_attribute_change_reads_model_attribute_guards_only():
    assert attribute_change("self._modules['enc'].ready == True  # x") is not None
    assert "model.enc.ready" in str(attribute_change("self._modules['enc'].ready == True"))
    assert attribute_change("self._modules['enc'].training == True") is None  # a mode
    assert attribute_change("len(kwargs) == 1") is None
    assert attribute_change("tensor 'x' stride mismatch at index 0") is None

"""compile_regions compiles what it names (issue 22 item 5): torch's own blocks, a
ModuleList of nn.Linear, ModuleDict blocks, subclasses that inherit forward and a
Hugging Face decoder's layers each compile a graph, give the eager model's outputs,
and keep the module tree; what it cannot compile it refuses with the reason."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from shapebucket import ShapeBucketError
from shapebucket.compile import CompileCounter, compile_regions, no_recompiles, prewarm
from shapebucket.plan.shapes import ShapePlan

EAGER = {"backend": "eager", "dynamic": False}


pytestmark = pytest.mark.usefixtures("fresh_compiler")


class Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = layers

    def forward(self, x):
        for layer in (
            self.layers.values() if isinstance(self.layers, nn.ModuleDict) else self.layers
        ):
            x = torch.relu(layer(x))
        return x


class MyLinear(nn.Linear):  # inherits nn.Linear.forward
    pass


def linears(cls=nn.Linear):
    return Stack(nn.ModuleList([cls(8, 8) for _ in range(3)]))


def encoder():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))


CASES = {
    "ModuleList of nn.Linear": (linears, ["layers.0", "layers.1", "layers.2"], (2, 8)),
    "subclass inheriting forward": (
        lambda: linears(MyLinear),
        ["layers.0", "layers.1", "layers.2"],
        (2, 8),
    ),
    "ModuleDict": (
        lambda: Stack(nn.ModuleDict({k: nn.Linear(8, 8) for k in "abc"})),
        ["layers.a", "layers.b", "layers.c"],
        (2, 8),
    ),
    "nn.TransformerEncoder": (encoder, ["0.layers.0", "0.layers.1"], (2, 5, 8)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compile_regions_compiles_torch_blocks(case):
    make, names, shape = CASES[case]
    torch.manual_seed(0)
    model = make()
    ref = copy.deepcopy(model)
    keys = list(model.state_dict())
    assert compile_regions(model, **EAGER) == names
    x = torch.randn(*shape)
    with CompileCounter() as cc:
        out = model(x)
    assert cc.graphs >= 1, f"{case}: compile_regions named blocks but compiled nothing"
    assert torch.allclose(out, ref(x), atol=1e-6)
    assert list(model.state_dict()) == keys  # the module tree is the same
    twin = copy.deepcopy(model)  # a copy calls its own blocks, not the original's
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    assert not torch.equal(twin(x), out)
    with CompileCounter() as again:
        model(torch.randn(*shape))
    assert again.graphs == 0


def test_regional_prewarm_of_torch_blocks_reports_graphs():
    model = linears()
    compile_regions(model, **EAGER)
    plan = ShapePlan.from_function([(2, 8), (4, 8)], lambda s: torch.randn(s.rows, s.length))
    report = prewarm(model, plan, progress=False)
    assert all(g >= 1 for g in report.graphs.values())
    with CompileCounter() as cc, no_recompiles(plan):
        model(torch.randn(4, 8)).sum().backward()
    assert cc.graphs == 0


def test_compile_regions_refuses_with_the_reason():
    model = linears()
    compile_regions(model, **EAGER)
    with pytest.raises(
        ShapeBucketError, match="'layers.0' \\(Linear\\) already has its own forward"
    ):
        compile_regions(model, **EAGER)

    class Scripted(nn.Module):
        forward = None  # no Python forward (as a scripted or C++ module)

    holder = nn.Sequential(Scripted(), Scripted())
    with pytest.raises(ShapeBucketError, match="no Python forward to compile"):
        compile_regions(holder, **EAGER)


def test_compile_regions_compiles_a_hf_decoders_layers():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ref = copy.deepcopy(model)
    names = compile_regions(model, **EAGER)
    assert names == ["model.layers.0", "model.layers.1"]
    ids = torch.randint(0, 64, (2, 8))
    with CompileCounter() as cc:
        logits = model(input_ids=ids).logits
    assert cc.graphs >= 1
    assert torch.allclose(logits, ref(input_ids=ids).logits, atol=1e-5)

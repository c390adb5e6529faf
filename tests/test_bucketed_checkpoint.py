"""docs/bucketed.md, "Checkpoints": the wrapper's own state_dict keys gain ``model.``
(and ``_orig_mod.`` with torch.compile), and the documented way (the wrapped model's own
state_dict) round-trips exactly into an unwrapped model, in either compile order."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from shapebucket import BucketedModel

pytestmark = pytest.mark.usefixtures("fresh_compiler")
EAGER = {"backend": "eager", "dynamic": False}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.emb(input_ids)) * self.scale


def trained(model: nn.Module, net: nn.Module) -> None:
    """One SGD step through the wrapper, and a buffer changed: weights differ from init."""
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    model(input_ids=torch.arange(6).view(2, 3)).pow(2).mean().backward()
    opt.step()
    with torch.no_grad():
        net.scale.mul_(3.0)


def round_trip(state: dict[str, torch.Tensor]) -> Net:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    torch.manual_seed(123)  # another init: only the load can make it equal
    fresh = Net()
    fresh.load_state_dict(torch.load(buffer))  # strict
    return fresh


def assert_same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("order", ["wrap, then compile", "compile, then wrap", "no compile"])
def test_the_documented_checkpoint_round_trips_exactly(order):
    torch.manual_seed(0)
    net = Net()
    if order == "wrap, then compile":
        model = torch.compile(BucketedModel(net, [4, 8]), **EAGER)
        wrapped = model.model  # what the docs save: the wrapped model, here net itself
        prefix = "_orig_mod.model."
    elif order == "compile, then wrap":
        model = BucketedModel(torch.compile(net, **EAGER), [4, 8])
        wrapped = net  # model.model is the compiled module: save the unwrapped one's
        prefix = "model._orig_mod."
    else:
        model = BucketedModel(net, [4, 8])
        wrapped = model.model
        prefix = "model."
    trained(model, net)
    assert wrapped is net
    assert sorted(model.state_dict()) == sorted(prefix + k for k in net.state_dict())
    assert_same(round_trip(wrapped.state_dict()), net)


def test_the_wrappers_own_state_dict_loads_nothing_into_the_plain_model():
    """The pitfall the docs name: strict refuses it, strict=False silently loads nothing."""
    torch.manual_seed(0)
    net = Net()
    wrapper = BucketedModel(net, [4, 8])
    trained(wrapper, net)
    fresh = Net()
    with pytest.raises(RuntimeError, match="Missing key"):
        fresh.load_state_dict(wrapper.state_dict())
    result = fresh.load_state_dict(wrapper.state_dict(), strict=False)
    assert sorted(result.missing_keys) == sorted(net.state_dict())
    assert not torch.equal(fresh.emb.weight, net.emb.weight)

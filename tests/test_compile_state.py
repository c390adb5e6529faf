"""snapshot/restore as an invariant: whatever a step does to the state prewarm can see,
restore puts back bitwise, in place, and more than once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from shapebucket import ShapeBucketError
from shapebucket.compile.state import restore, snapshot


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.norm = nn.BatchNorm1d(2)
        self.count = torch.zeros(())  # a plain tensor attribute


def state(model, opt, scaler, ema, extra):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {
            n: (None if p.grad is None else p.grad.clone(), p.requires_grad)
            for n, p in model.named_parameters()
        },
        model.count.clone(),
        model.training,
        repr(opt.state_dict()),
        scaler.state_dict(),
        {k: v.clone() for k, v in ema.state_dict().items()},
        extra.clone(),
        torch.get_rng_state(),
    )


def same(a, b):
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for k in x:
                u, v = x[k], y[k]
                if isinstance(u, tuple):
                    assert (u[0] is None) == (v[0] is None) and u[1] == v[1]
                    assert u[0] is None or torch.equal(u[0], v[0])
                elif isinstance(u, torch.Tensor):
                    assert torch.equal(u, v)
                else:
                    assert u == v
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        else:
            assert x == y


ACTIONS = st.sampled_from(
    [
        "train_step",
        "zero_grad_none",
        "freeze",
        "eval",
        "attr_new",
        "attr_inplace",
        "rng",
        "ema",
        "scaler",
        "extra",
    ]
)


@settings(max_examples=40, deadline=None)
@given(st.lists(ACTIONS, max_size=8), st.booleans())
def test_restore_undoes_any_sequence_of_changes(actions, grads_before):
    torch.manual_seed(0)
    model, ema = Net(), Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1)
    extra = torch.ones(4)
    x = torch.randn(5, 3)
    if grads_before:
        model.norm(model.lin(x)).sum().backward()
    before = state(model, opt, scaler, ema, extra)
    snap = snapshot(model, opt, scaler, ema, extra)
    params = [p for p in model.parameters()]
    for action in actions:
        if action == "train_step":
            model.train()
            model.norm(model.lin(x)).pow(2).mean().backward()
            opt.step()
        elif action == "zero_grad_none":
            opt.zero_grad(set_to_none=True)
        elif action == "freeze":
            model.lin.weight.requires_grad_(False)
        elif action == "eval":
            model.eval()
        elif action == "attr_new":
            model.count = model.count + 1
        elif action == "attr_inplace":
            model.count.add_(2)
        elif action == "rng":
            torch.rand(3)
        elif action == "ema":
            with torch.no_grad():
                next(ema.parameters()).add_(1)
        elif action == "scaler":
            scaler.scale(torch.ones(()))  # creates the scale lazily
            scaler.update(new_scale=3.0)
        elif action == "extra":
            extra.mul_(5)
    for _ in range(2):  # prewarm restores twice: after compiling and after verifying
        restore(snap)
        same(before, state(model, opt, scaler, ema, extra))
    assert [p for p in model.parameters()] == params  # the same objects, in place


def test_snapshot_refuses_objects_it_cannot_copy():
    with pytest.raises(ShapeBucketError, match="cannot snapshot a list"):
        snapshot(nn.Linear(2, 2), [1, 2])

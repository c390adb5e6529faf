"""snapshot/restore as an invariant: whatever a step does to the state prewarm can see,
restore puts back bitwise, in place, and more than once."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from shapebucket import ShapeBucketError, ShapePlan, prewarm
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


# -- prewarm over generated modules, against a deepcopy taken before ----------------------


class RunningMean(nn.Module):
    """Issue #30 defect 4: a running statistic that ``forward`` replaces out of place."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("avg", torch.zeros(4))

    def forward(self, x):
        self.avg = 0.9 * self.avg + 0.1 * torch.ones(4)
        return self.lin(x).sum()


def test_prewarm_restores_a_buffer_that_forward_replaces(fresh_compiler):
    model = RunningMean()
    original = model.avg
    compiled = torch.compile(model, dynamic=False, backend="eager")
    plan = ShapePlan.from_function([(2, 4), (3, 4)], lambda s: torch.ones(s.rows, s.length))
    prewarm(compiled, plan, progress=False)
    assert model.avg is original  # by name: the module holds its own buffer again
    assert torch.equal(model.avg, torch.zeros(4))  # not 1 - 0.9**4 = 0.3439


MUTATIONS = st.sampled_from(
    [
        "buffer_inplace",
        "buffer_replaced",
        "int_buffer_replaced",
        "param_inplace",
        "param_replaced",
        "requires_grad",
        "tensor_attr_inplace",
        "tensor_attr_replaced",
        "number_attrs",
        "rng",
        "eval",
    ]
)


class Mutant(nn.Module):
    """A module whose forward makes the changes it is given, every call."""

    def __init__(self, mutations):
        super().__init__()
        self.mutations = tuple(mutations)
        self.lin = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.randn(4))
        self.register_buffer("avg", torch.zeros(4))
        self.register_buffer("hits", torch.zeros((), dtype=torch.int64))
        self.scale = torch.ones(())
        self.steps = 0
        self.tag = "a"

    def forward(self, x):
        for m in self.mutations:
            if m == "buffer_inplace":
                self.avg.mul_(0.5).add_(x.detach().mean(0))
            elif m == "buffer_replaced":
                self.avg = 0.9 * self.avg + 0.1 * x.detach().mean(0)
            elif m == "int_buffer_replaced":
                self.hits = self.hits + 1
            elif m == "param_inplace":
                with torch.no_grad():
                    self.lin.weight.add_(0.25)
            elif m == "param_replaced":
                self.gain = nn.Parameter(self.gain.detach() * 2)
            elif m == "requires_grad":
                self.lin.bias.requires_grad_(False)
            elif m == "tensor_attr_inplace":
                self.scale.add_(1)
            elif m == "tensor_attr_replaced":
                self.scale = self.scale * 3
            elif m == "number_attrs":
                self.steps += 1
                self.tag += "x"
            elif m == "rng":
                x = x + torch.rand_like(x)
            elif m == "eval":
                self.train(False)
        return (self.lin(x) * self.gain * self.scale).sum()


def bits(t):
    """A tensor's bytes (dtype and shape apart), for a bitwise comparison."""
    return (t.dtype, tuple(t.shape), t.detach().reshape(-1).contiguous().view(torch.uint8))


def same_bits(a, b):
    if a is None or b is None:
        assert a is None and b is None
    elif isinstance(a, torch.Tensor):
        x, y = bits(a), bits(b)
        assert x[:2] == y[:2] and torch.equal(x[2], y[2])
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same_bits(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same_bits(x, y)
    else:
        assert a == b


def module_state(model):
    return {
        "state_dict": dict(model.state_dict()),
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": [m.training for m in model.modules()],
        "scale": model.scale,
        "numbers": (model.steps, model.tag),
    }


@settings(max_examples=60, deadline=None)
@given(
    mutations=st.lists(MUTATIONS, max_size=5),
    optimizer_passed=st.booleans(),
    grads_before=st.booleans(),
)
def test_prewarm_puts_back_whatever_a_generated_module_changes(
    mutations, optimizer_passed, grads_before
):
    torch.manual_seed(0)
    model = Mutant(mutations)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    if grads_before:  # a step before prewarm: optimizer state and grads exist
        model.lin(torch.ones(2, 4)).sum().backward()
        opt.step()
    before_model, before_opt = copy.deepcopy((model, opt))
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    for n, p in before_model.named_parameters():  # a Parameter's deepcopy drops its .grad
        p.grad = grads[n]
    objects = {n: id(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}
    objects["scale"] = id(model.scale)
    rng = torch.get_rng_state()

    def step(batch):
        model(batch).backward()
        opt.step()

    plan = ShapePlan.from_function([(2, 4), (3, 4)], lambda s: torch.randn(s.rows, s.length))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an uncompiled model: "prewarm compiled 0 graphs"
        prewarm(model, plan, step=step, restore=[opt] if optimizer_passed else [], progress=False)
    same_bits(module_state(model), module_state(before_model))
    same_bits(opt.state_dict(), before_opt.state_dict())
    assert torch.equal(torch.get_rng_state(), rng)
    after = {n: id(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}
    assert after == {k: v for k, v in objects.items() if k != "scale"}  # the same objects
    assert id(model.scale) == objects["scale"]
    assert opt.param_groups[0]["params"] == list(model.parameters())

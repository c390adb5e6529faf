"""Snapshot and restore everything a training step changes, bitwise and in place.

:func:`shapebucket.prewarm` runs real training steps to compile them and then
puts the model, the optimizer and the random number generators back exactly as
they were; this module is that job, usable (and tested) alone.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Snapshot", "restore", "snapshot"]


@dataclass
class Snapshot:
    """Copies of everything a training step can change, taken by :func:`snapshot`."""

    params: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    buffers: list[tuple[torch.Tensor, torch.Tensor]]
    optimizer: Any
    opt_state: dict[Any, dict[str, Any]] | None
    opt_groups: list[dict[str, Any]] | None
    rng: tuple[Any, ...]
    training: list[tuple[torch.nn.Module, bool]]


def _tensors_of(
    model: Any, optimizer: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.nn.Module]]:
    params: dict[int, torch.Tensor] = {}
    buffers: dict[int, torch.Tensor] = {}
    modules: list[torch.nn.Module] = []
    if isinstance(model, torch.nn.Module):
        modules = list(model.modules())
        params.update((id(p), p) for p in model.parameters())
        buffers.update((id(b), b) for b in model.buffers())
    if optimizer is not None:
        for group in optimizer.param_groups:
            params.update((id(p), p) for p in group["params"])
    return list(params.values()), list(buffers.values()), modules


def snapshot(model: Any, optimizer: Any = None) -> Snapshot:
    """Copy the parameters, buffers and ``.grad``s of ``model`` (and of ``optimizer``'s
    parameters), the optimizer's state and hyper-parameters, every module's train
    flag and the torch, CUDA, numpy and Python RNG states.

    >>> model = torch.nn.Linear(2, 1)
    >>> snap = snapshot(model)
    >>> with torch.no_grad():
    ...     _ = model.weight.add_(1.0)
    >>> restore(snap); torch.equal(model.weight, snap.params[0][1])
    True
    """
    params, buffers, modules = _tensors_of(model, optimizer)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    rng = (
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if cuda else None,
        np.random.get_state(),
        random.getstate(),
    )
    opt_state = opt_groups = None
    if optimizer is not None:
        opt_state = {
            p: {
                k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                for k, v in s.items()
            }
            for p, s in optimizer.state.items()
        }
        opt_groups = [
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups
        ]
    return Snapshot(
        params=[
            (p, p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
            for p in params
        ],
        buffers=[(b, b.detach().clone()) for b in buffers],
        optimizer=optimizer,
        opt_state=opt_state,
        opt_groups=opt_groups,
        rng=rng,
        training=[(m, m.training) for m in modules],
    )


@torch.no_grad()
def restore(snap: Snapshot) -> None:
    """Put everything :func:`snapshot` copied back, bitwise and in place (the same tensor
    objects, so compiled guards on them still hold)."""
    for p, value, grad in snap.params:
        p.copy_(value)
        if grad is None:
            p.grad = None
        elif p.grad is not None and p.grad.shape == grad.shape:
            p.grad.copy_(grad)
        else:
            p.grad = grad.clone()
    for b, value in snap.buffers:
        b.copy_(value)
    opt = snap.optimizer
    if opt is not None and snap.opt_state is not None and snap.opt_groups is not None:
        for p in list(opt.state.keys()):
            if p not in snap.opt_state:
                del opt.state[p]
        for p, saved in snap.opt_state.items():
            live = opt.state[p]
            for k in list(live.keys()):
                if k not in saved:
                    del live[k]
            for k, v in saved.items():
                cur = live.get(k)
                if (
                    isinstance(v, torch.Tensor)
                    and isinstance(cur, torch.Tensor)
                    and cur.shape == v.shape
                ):
                    cur.copy_(v)
                else:
                    live[k] = v.clone() if isinstance(v, torch.Tensor) else v
        for group, saved_group in zip(opt.param_groups, snap.opt_groups, strict=True):
            group.update(saved_group)
    cpu, cuda, np_state, py_state = snap.rng
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(np_state)
    random.setstate(py_state)
    for m, mode in snap.training:
        m.training = mode

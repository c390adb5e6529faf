"""Snapshot and restore everything a training step changes, bitwise and in place: what
:func:`shapebucket.prewarm` puts back after its steps (what it sees and what it cannot:
``docs/compile.md``, the ``prewarm`` section)."""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..errors import ShapeBucketError

__all__ = ["Snapshot", "optimizers_stepped", "restore", "restore_objects", "snapshot"]


@dataclass
class _Optimizer:
    optimizer: torch.optim.Optimizer
    state: dict[Any, dict[str, Any]]
    groups: list[dict[str, Any]]


@dataclass
class Snapshot:
    """Copies of everything a training step can change, taken by :func:`snapshot`.

    ``params`` holds ``(parameter, value, grad, requires_grad)``; ``attributes``
    ``(module, name, tensor, value, requires_grad)`` for tensors kept as plain
    module attributes; ``tensors`` ``(tensor, value, requires_grad)``;
    ``stateful`` ``(object, state_dict)``; ``names`` ``(module, name, object)``:
    what each module held under each name (parameters, buffers, attributes), put
    back first, so a value replaced by another object is restored by name.
    """

    params: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]]
    buffers: list[tuple[torch.Tensor, torch.Tensor]]
    optimizers: list[_Optimizer]
    rng: tuple[Any, ...]
    training: list[tuple[torch.nn.Module, bool]]
    attributes: list[tuple[torch.nn.Module, str, torch.Tensor, torch.Tensor, bool]]
    tensors: list[tuple[torch.Tensor, torch.Tensor, bool]]
    stateful: list[tuple[Any, Any]]
    names: list[tuple[torch.nn.Module, str, Any]]


def _clone(value: Any) -> Any:
    """A deep copy whose tensors are detached clones."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return copy.deepcopy(value)


#: Module attributes put back by name (immutable values: a rebinding is the only change).
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_MISSING = object()


def _put(t: torch.Tensor, value: torch.Tensor) -> None:
    """``t`` takes ``value`` bitwise, in place (resized first if a step resized it)."""
    if t.shape != value.shape:
        t.data = value.clone()
    else:
        t.copy_(value)


def _copy_optimizer(opt: torch.optim.Optimizer) -> _Optimizer:
    return _Optimizer(
        optimizer=opt,
        state={p: _clone(s) for p, s in opt.state.items()},
        groups=[
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups
        ],
    )


def _restore_optimizer(saved: _Optimizer) -> None:
    opt = saved.optimizer
    for p in list(opt.state.keys()):
        if p not in saved.state:
            del opt.state[p]
    for p, state in saved.state.items():
        live = opt.state[p]
        for k in list(live.keys()):
            if k not in state:
                del live[k]
        for k, v in state.items():
            cur = live.get(k)
            if isinstance(v, torch.Tensor) and isinstance(cur, torch.Tensor):
                _put(cur, v)
            else:
                live[k] = _clone(v)
    for group, saved_group in zip(opt.param_groups, saved.groups, strict=True):
        group.update(copy.deepcopy(saved_group))


_WHAT = (
    "pass optimizers, modules, tensors, or objects with state_dict()/load_state_dict() "
    "(a GradScaler, an LR scheduler)"
)


def _kind(obj: Any) -> str | None:
    """How :func:`snapshot` copies ``obj`` (``"none"``: it skips it; ``None``: it cannot)."""
    if obj is None:
        return "none"
    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.Tensor):
        return "tensor"
    if callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    ):
        return "stateful"
    return None


def _a(obj: Any) -> str:
    name = type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def restore_objects(restore: Any, who: str) -> list[Any]:
    """``restore=`` of ``who`` (prewarm, calibrate_rows) as a list: one object to snapshot
    (an optimizer, a module, a tensor, a ``GradScaler``) or an iterable of them, each
    checked before anything runs; ``who`` names the caller in the error.

    >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    >>> restore_objects(opt, "prewarm") == [opt], restore_objects((), "prewarm")
    (True, [])
    """
    if _kind(restore) not in (None, "none"):
        return [restore]
    if isinstance(restore, (str, bytes)) or not isinstance(restore, Iterable):
        raise ShapeBucketError(
            f"{who}: restore must be a list of objects to snapshot (optimizers, a GradScaler, "
            f"an EMA model, tensors), got {restore!r:.80}; pass () for none"
        )
    objects = list(restore)
    for i, obj in enumerate(objects):
        if _kind(obj) is None:
            raise ShapeBucketError(f"{who}: cannot snapshot {_a(obj)} (restore[{i}]): {_WHAT}")
    return objects


def snapshot(model: Any, *others: Any) -> Snapshot:
    """Copy what a training step of ``model`` can change (see the module's docstring).

    ``others`` are the other objects the step changes: optimizers, modules (an
    EMA copy), plain tensors, and objects with ``state_dict``/``load_state_dict``
    (``torch.amp.GradScaler``, LR schedulers).

    >>> model = torch.nn.Linear(2, 1)
    >>> snap = snapshot(model)
    >>> with torch.no_grad():
    ...     _ = model.weight.add_(1.0)
    >>> restore(snap); torch.equal(model.weight, snap.params[0][1])
    True
    """
    modules, optimizers, tensors, stateful = _by_kind(model, others)
    params, buffers, attributes, names = _module_state(modules)
    for opt in optimizers:
        for group in opt.param_groups:
            params.update((id(p), p) for p in group["params"])
    return Snapshot(
        params=[
            (
                p,
                p.detach().clone(),
                None if p.grad is None else p.grad.detach().clone(),
                p.requires_grad,
            )
            for p in params.values()
        ],
        buffers=[(b, b.detach().clone()) for b in buffers.values()],
        optimizers=[_copy_optimizer(opt) for opt in optimizers],
        rng=_rng_state(),
        training=[(m, m.training) for m in modules.values()],
        attributes=attributes,
        tensors=[(t, t.detach().clone(), t.requires_grad) for t in tensors.values()],
        stateful=[(obj, _clone(obj.state_dict())) for obj in stateful],
        names=names,
    )


def _by_kind(
    model: Any, others: tuple[Any, ...]
) -> tuple[
    dict[int, torch.nn.Module], list[torch.optim.Optimizer], dict[int, torch.Tensor], list[Any]
]:
    """What :func:`snapshot` was given, by kind: every module (submodules included, once),
    the optimizers, the plain tensors and the stateful objects; refused when it cannot copy one."""
    modules: dict[int, torch.nn.Module] = {}
    optimizers: list[torch.optim.Optimizer] = []
    tensors: dict[int, torch.Tensor] = {}
    stateful: list[Any] = []
    for i, obj in enumerate((model, *others)):
        kind = _kind(obj)
        if kind == "module":
            modules.update((id(m), m) for m in obj.modules())
        elif kind == "optimizer":
            optimizers.append(obj)
        elif kind == "tensor":
            tensors[id(obj)] = obj
        elif kind == "stateful":
            stateful.append(obj)
        elif kind is None and i > 0:
            raise ShapeBucketError(f"cannot snapshot {_a(obj)}: {_WHAT}")
    return modules, optimizers, tensors, stateful


def _module_state(
    modules: dict[int, torch.nn.Module],
) -> tuple[
    dict[int, torch.Tensor],
    dict[int, torch.Tensor],
    list[tuple[torch.nn.Module, str, torch.Tensor, torch.Tensor, bool]],
    list[tuple[torch.nn.Module, str, Any]],
]:
    """What the modules hold: their parameters and buffers (each once), copies of their
    tensor attributes, and every name to put back (parameters, buffers, public scalars)."""
    params: dict[int, torch.Tensor] = {}
    buffers: dict[int, torch.Tensor] = {}
    attributes = []
    names: list[tuple[torch.nn.Module, str, Any]] = []
    for m in modules.values():
        params.update((id(p), p) for p in m.parameters(recurse=False))
        buffers.update((id(b), b) for b in m.buffers(recurse=False))
        names += [(m, n, p) for n, p in m.named_parameters(recurse=False)]
        names += [(m, n, b) for n, b in m.named_buffers(recurse=False)]
        for name, value in vars(m).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                attributes.append((m, name, value, value.detach().clone(), value.requires_grad))
            elif isinstance(value, _SCALARS) and not name.startswith("_") and name != "training":
                names.append((m, name, value))
    return params, buffers, attributes, names


def _rng_state() -> tuple[Any, ...]:
    """The torch, CUDA (when initialised), numpy and Python random states."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return (
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if cuda else None,
        np.random.get_state(),
        random.getstate(),
    )


@torch.no_grad()
def restore(snap: Snapshot) -> None:
    """Put everything :func:`snapshot` copied back, bitwise and in place (the same tensor
    objects, under the same names, so compiled guards on them still hold). Can be called
    more than once."""
    for m, name, obj in snap.names:
        if getattr(m, name, _MISSING) is not obj:
            setattr(m, name, obj)
    for p, value, grad, requires_grad in snap.params:
        _put(p, value)
        p.requires_grad_(requires_grad)
        if grad is None:
            p.grad = None
        elif p.grad is not None and p.grad.shape == grad.shape:
            p.grad.copy_(grad)
        else:
            p.grad = grad.clone()
    for b, value in snap.buffers:
        _put(b, value)
    for m, name, tensor, value, requires_grad in snap.attributes:
        if tensor.shape != value.shape or tensor.is_inference():
            # resized, or made under inference_mode (no in-place update outside it): a copy
            tensor = value.clone().requires_grad_(requires_grad)
        else:
            tensor.copy_(value)
            if tensor.is_leaf:
                tensor.requires_grad_(requires_grad)
        setattr(m, name, tensor)
    for t, value, requires_grad in snap.tensors:
        t.copy_(value)
        if t.is_leaf:
            t.requires_grad_(requires_grad)
    for saved in snap.optimizers:
        _restore_optimizer(saved)
    for obj, state in snap.stateful:
        obj.load_state_dict(_clone(state))
    cpu, cuda, np_state, py_state = snap.rng
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(np_state)
    random.setstate(py_state)
    for m, mode in snap.training:
        m.training = mode


@contextlib.contextmanager
def optimizers_stepped(
    known: Iterable[Any] = (),
) -> Iterator[dict[torch.optim.Optimizer, Snapshot]]:
    """Optimizers that step inside the block and are not in ``known``: a global pre-hook
    (removed on exit) sees each before its first step and snapshots it then, so a caller
    that ran steps (prewarm, calibrate_rows) puts it back with :func:`restore` even when
    the user's step closes over it. The snapshot includes the optimizer's parameters as
    they are inside that step: restore the caller's own snapshot after these.

    >>> p = torch.nn.Parameter(torch.ones(1))
    >>> opt = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    >>> with optimizers_stepped() as found:
    ...     p.grad = torch.ones(1); opt.step()
    >>> list(found) == [opt] and opt.state[p] != {}
    True
    >>> for snap in found.values(): restore(snap)
    >>> opt.state[p]
    {}
    """
    skip = {id(o) for o in known}
    found: dict[torch.optim.Optimizer, Snapshot] = {}

    def catch(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(opt) not in skip and opt not in found:
            found[opt] = snapshot(None, opt)

    hook = register_optimizer_step_pre_hook(catch)
    try:
        yield found
    finally:
        hook.remove()

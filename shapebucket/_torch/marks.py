"""Marks on tensors and functions that steer dynamo: dynamic dims and skipped frames."""

from __future__ import annotations

from typing import Any

import torch

from .dynamo import dynamo_module


def mark_dynamic_dim(
    t: torch.Tensor, dim: int, *, strict: bool, min: int | None, max: int | None
) -> None:
    """``mark_dynamic`` with its range when ``strict``, else ``maybe_mark_dynamic`` (no range)."""
    d = dynamo_module()
    if strict:
        kwargs = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
        d.mark_dynamic(t, dim, **kwargs)
    else:
        # maybe_mark_dynamic takes no range in any supported torch release.
        d.maybe_mark_dynamic(t, dim)


_SKIP = "_shapebucket_skip_frame"  # set on a function by skip_frame_only
_NOT_COMPILED = "_shapebucket_not_compiled"  # set on a function by not_compiled
_APPLIED = "_shapebucket_marks_applied"  # set on an owner by apply_compiler_marks


def skip_frame_only(fn: Any) -> Any:
    """Mark ``fn``'s own frames never to be compiled, while the functions it calls still
    are (``torch._dynamo.decorators.skip``; the public ``torch.compiler.disable(fn,
    recursive=False)`` wraps ``fn`` in a skipped frame but compiles ``fn``'s own). Returns
    ``fn``; the mark takes effect at :func:`apply_compiler_marks` on its class or module, so
    that a decorator loads no dynamo when the package is imported."""
    setattr(fn, _SKIP, True)
    return fn


def not_compiled(fn: Any) -> Any:
    """``torch.compiler.disable(fn)`` (``fn`` and what it calls never compiled), put in
    place by :func:`apply_compiler_marks` on its class or module. Returns ``fn``."""
    setattr(fn, _NOT_COMPILED, True)
    return fn


def apply_compiler_marks(*owners: Any) -> None:
    """Apply the marks of :func:`skip_frame_only` and :func:`not_compiled` to the functions
    defined on ``owners`` (classes or modules), once per owner: call it before the first
    use of what they hold (a constructor, ``__setstate__``). This loads dynamo."""
    for owner in owners:
        if vars(owner).get(_APPLIED):
            continue
        for name, value in list(vars(owner).items()):
            if getattr(value, _SKIP, False):
                from torch._dynamo.decorators import skip

                skip(value)
            elif getattr(value, _NOT_COMPILED, False):
                setattr(owner, name, torch.compiler.disable(value))
        setattr(owner, _APPLIED, True)

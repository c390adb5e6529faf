"""What of a wrapper's call the compiler sees: the wrapper's ``forward``, the parts never
traced, a call run with the compiler off, and the one dynamic graph of calls past the plan.

``torch.compile`` of a :class:`~shapebucket.BucketedModel` compiles the model's call on
the padded batch only, one graph per planned shape: the padding before it and the cut
back after it are never traced. The marks that say so (``skip_frame_only``,
``not_compiled``) load dynamo, so they wait for :func:`apply_marks`, called when the
first wrapper is built or unpickled.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from .. import _torch as compat
from .calls import Call, forward_of
from .outputs import cut_outputs

__all__ = ["DynamicGraph", "Forward", "apply_marks", "cut_back", "in_compiled_call", "uncompiled"]


class Forward:
    """The wrapper's ``forward``: the wrapped model's signature (so a ``Trainer`` keeps the
    dataset columns the model takes), the wrapper's padding (``owner.bucketed_call``).
    Pickles and deep-copies with its owner."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    @compat.skip_frame_only  # a compiled wrapper compiles the padded call only
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.owner.bucketed_call(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(forward_of(self.owner.model))


class DynamicGraph:
    """The one dynamic graph of the calls past the plan (``overflow="dynamic"``), on a code
    object of its own (no cache entry or recompile count shared with the static graphs),
    compiled at its first call; pickles and copies without it."""

    def __init__(self) -> None:
        self.compiled: Any = None

    @compat.skip_frame_only  # a compiled wrapper: the dynamic graph is its own compile
    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        if self.compiled is None:
            self.compiled = torch.compile(
                compat.fresh_forward(f"bucketed_dynamic_{id(self)}"), dynamic=True
            )
        return self.compiled(compat.unwrap_compiled(model), batch)

    def __getstate__(self) -> dict[str, Any]:
        return {"compiled": None}


@compat.not_compiled
def cut_back(out: Any, call: Call) -> Any:
    """``cut_outputs``, not compiled (so a compiled wrapper has no graph per call shape)."""
    return cut_outputs(out, call.outputs, call)


#: dynamo's frame callback, read by a C function (so that asking traces no Python frame);
#: set by :func:`apply_marks`
_frame_callback: Any = None


@compat.skip_frame_only  # never traced: it only asks
def in_compiled_call() -> bool:
    """Whether this call runs inside a ``torch.compile``'d call (a compiled wrapper),
    where ``torch.compiler.set_stance`` raises."""
    return _frame_callback() not in (None, False)


@compat.skip_frame_only  # never traced: it turns the compiler off for what it calls
def uncompiled(model: Any, batch: dict[str, Any]) -> Any:
    """``model(**batch)`` with the compiler off: ``set_stance("force_eager")`` (no graph
    compiled, no CUDA graph recorded, also for compiled parts inside), or, inside a
    compiled wrapper where the stance cannot change, the module ``torch.compile`` wraps
    under ``torch.compiler.disable``."""
    if _frame_callback() in (None, False):
        with torch.compiler.set_stance("force_eager"):
            return model(**batch)
    return torch.compiler.disable(compat.unwrap_compiled(model))(**batch)


def apply_marks(*owners: Any) -> None:
    """The compiler marks of this module and of ``owners`` (the wrapper's class), at the
    first wrapper built or unpickled (``import`` loads no dynamo)."""
    global _frame_callback
    _frame_callback = compat.frame_callback_getter()
    compat.apply_compiler_marks(Forward, DynamicGraph, sys.modules[__name__], *owners)

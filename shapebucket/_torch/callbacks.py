"""Dynamo's compile-start callbacks: each compile seen as it starts, the lazily compiled
backward of an AOT-autograd graph included (it compiles at the first ``backward()``
through the graph, outside any dynamo frame, so no dynamo counter sees it)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def on_compile_start(callback: Callable[[str, bool], None]) -> Iterator[None]:
    """Call ``callback(compile_id, backward)`` whenever the compiler starts work inside the
    block: a dynamo frame (``backward=False``) or the lazy compile of the backward graph of
    the frame ``compile_id`` names (``backward=True``). An exception the callback raises
    stops that compile and reaches the caller (of ``backward()`` for a backward graph).
    The callback is removed on exit."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    kinds = {CallbackTrigger.DYNAMO: False, CallbackTrigger.LAZY_BACKWARD: True}

    def start(args: Any) -> None:
        backward = kinds.get(args.callback_trigger)
        if backward is not None:
            callback(str(args.compile_id), backward)

    callback_handler.register_start_callback(start)
    try:
        yield
    finally:
        callback_handler.remove_start_callback(start)

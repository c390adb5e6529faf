"""Dynamo's log records routed to a handler: recompile reasons and recompile-limit warnings."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def add_recompile_handler(handler: logging.Handler) -> Iterator[None]:
    """Send dynamo's ``recompiles`` log records to ``handler`` for the block, the artifact
    turned on as ``TORCH_LOGS=recompiles`` does; the logging state is put back after."""
    from torch._logging import _internal

    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    state = _internal.log_state
    was_enabled = state.is_artifact_enabled("recompiles")
    if not was_enabled:
        state.enable_artifact("recompiles")
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        with _handler(logger, handler):
            yield
    finally:
        logger.setLevel(old_level)
        logger.propagate = old_propagate
        if not was_enabled:
            state.artifact_names.discard("recompiles")


@contextlib.contextmanager
def add_limit_handler(handler: logging.Handler) -> Iterator[None]:
    """Send dynamo's 'hit config.recompile_limit' warnings to ``handler`` for the block."""
    with _handler(logging.getLogger("torch._dynamo.convert_frame"), handler):
        yield


@contextlib.contextmanager
def _handler(logger: logging.Logger, handler: logging.Handler) -> Iterator[None]:
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)

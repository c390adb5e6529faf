"""Regional compilation: compile a model's repeated blocks in place, not the whole model
(``docs/compile.md``, "Regional compilation")."""

from __future__ import annotations

import inspect
import types
from collections import Counter
from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = ["compile_regions", "repeated_blocks"]


def repeated_blocks(
    model: torch.nn.Module, block_types: tuple[type[torch.nn.Module], ...] | None = None
) -> list[tuple[str, torch.nn.Module]]:
    """The model's repeated blocks, as ``(name, module)``.

    By default: the children of every ``ModuleList``/``Sequential``/``ModuleDict``
    in which one class appears at least twice (the transformer layers),
    outermost first and not inside a block already found. ``block_types`` names
    the classes instead.

    >>> layers = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> [name for name, _ in repeated_blocks(torch.nn.Sequential(layers))]
    ['0.0', '0.1']
    """
    if not isinstance(model, torch.nn.Module):
        raise ShapeBucketError(f"compile_regions needs an nn.Module, got {type(model).__name__}")
    if block_types is not None:
        if not isinstance(block_types, tuple) or not all(isinstance(t, type) for t in block_types):
            raise ShapeBucketError(
                f"block_types must be a tuple of module classes, got {block_types!r}"
            )
        return [(n, m) for n, m in model.named_modules() if n and isinstance(m, block_types)]
    found: list[tuple[str, torch.nn.Module]] = []
    for name, container in model.named_modules():  # parents come before their children
        if not isinstance(
            container, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)
        ):
            continue
        if any(name == f or name.startswith(f + ".") for f, _ in found):
            continue  # inside a block already chosen: compiled with it
        children = list(container.named_children())
        counts = Counter(type(m) for _, m in children)
        for child_name, child in children:
            if counts[type(child)] >= 2:
                found.append((f"{name}.{child_name}" if name else child_name, child))
    return found


def compile_regions(
    model: torch.nn.Module,
    *,
    block_types: tuple[type[torch.nn.Module], ...] | None = None,
    **compile_kwargs: Any,
) -> list[str]:
    """Compile every repeated block of ``model`` in place; returns the compiled blocks' names.

    ``compile_kwargs`` go to ``torch.compile`` (``dynamic=False``, ``mode``,
    ``fullgraph``, ``backend``). Pass the model itself (not compiled) to
    :func:`~shapebucket.prewarm` and to the training loop afterwards.

    All blocks of a class share its ``forward`` code object, and so its
    recompile limit: one graph per shape and per distinct call signature (a
    first block whose input does not require grad and later ones whose input
    does are two), so K shapes need a limit >= K, which ``prewarm`` raises
    when it must (and raises an error when a block needs more). A block whose
    ``forward`` is already replaced on the instance (compiled before) or is not
    a Python function is refused with the reason, never skipped silently.

    >>> model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    >>> compile_regions(model, backend="eager", dynamic=False)
    ['0', '1', '2']
    """
    blocks = repeated_blocks(model, block_types)
    if not blocks:
        raise ShapeBucketError(
            f"{type(model).__name__} has no repeated blocks (no ModuleList, Sequential or "
            "ModuleDict holding "
            "one class twice or more); name the block classes with block_types=(MyBlock,), or "
            "compile the whole model"
        )
    compiled: dict[Any, Any] = {}
    for name, block in blocks:
        if "forward" in vars(block):
            raise ShapeBucketError(
                f"block {name!r} ({type(block).__name__}) already has its own forward "
                f"({vars(block)['forward']!r}): it was compiled before; call compile_regions "
                "once, on a model not compiled yet"
            )
        forward = getattr(type(block), "forward", None)
        if not inspect.isfunction(forward):
            raise ShapeBucketError(
                f"block {name!r} ({type(block).__name__}) has no Python forward to compile "
                f"({forward!r}); name other blocks with block_types=(...), or compile the whole model"
            )
        if forward not in compiled:
            compiled[forward] = torch.compile(forward, **compile_kwargs)
        block.forward = types.MethodType(compiled[forward], block)
    return [name for name, _ in blocks]

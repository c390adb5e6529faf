"""Regional compilation: compile a model's repeated blocks, not the whole model.

A transformer is one block class repeated N times. ``torch.compile(model)``
traces and compiles all N copies in one large graph per bucket;
:func:`compile_regions` compiles each block in place (``block.compile(...)``),
and since the blocks share one class, dynamo compiles the block's code once per
input shape and every other block reuses that graph (module parameters are
graph inputs, not constants). Prewarm cost then grows with the number of
distinct block classes, not with the number of layers. The layers between
blocks (embeddings, final norm, head) run eagerly.

This is the per-block recipe of PyTorch's regional compilation tutorial.
``torch.compiler.nested_compile_region`` (hierarchical compilation inside one
whole-model compile) is the other route; it is not used here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = ["compile_regions", "repeated_blocks"]


def repeated_blocks(
    model: torch.nn.Module, block_types: tuple[type[torch.nn.Module], ...] | None = None
) -> list[tuple[str, torch.nn.Module]]:
    """The model's repeated blocks, as ``(name, module)``.

    By default: the children of every ``ModuleList``/``Sequential`` in which one
    class appears at least twice (the transformer layers), outermost first and
    not inside a block already found. ``block_types`` names the classes instead.

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
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
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

    All blocks share the class's code object, and so its recompile limit: one
    graph per bucket (and per distinct call signature), so K buckets need a
    limit >= K, which ``prewarm`` raises when it must. The modules' call path
    (``Module._call_impl``) is what gets compiled, and it is shared by every
    module compiled with ``.compile()``; compile nothing else that way in the
    same process, or raise the limit for both.

    >>> model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    >>> compile_regions(model, backend="eager", dynamic=False)
    ['0', '1', '2']
    """
    blocks = repeated_blocks(model, block_types)
    if not blocks:
        raise ShapeBucketError(
            f"{type(model).__name__} has no repeated blocks (no ModuleList or Sequential holding "
            "one class twice or more); name the block classes with block_types=(MyBlock,), or "
            "compile the whole model"
        )
    for _, block in blocks:
        block.compile(**compile_kwargs)
    return [name for name, _ in blocks]

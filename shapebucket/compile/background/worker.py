"""The background compile's other process: build the model, compile each shape, publish it.

:func:`~shapebucket.compile.compile_in_background` spawns :func:`main` in a
fresh interpreter (the ``spawn`` start method: no state of the training process
is inherited), pinned to one core. It builds its own model with the user's
``build()``, compiles ``type(model).forward`` exactly as the training process
does, runs the first shape once eagerly (to settle a model that sets its own state
in its first call), then forward and backward (or the user's ``step(model, batch)``) on each
shape of the plan, most frequent first, and after each shape publishes what the
compiler made as a cache directory of its own (:func:`save_new_compile_cache`:
the portable artifacts and the new kernel files, with a manifest), named
``NNN-RxL``, then a ``NNN-RxL.json`` with its seconds (the ready signal). A
failure writes ``error.txt`` (the traceback); the end writes ``done.json``.

Its inductor cache is a private directory, so its kernels reach the training
process only through the published caches. It runs torch with the training
process's thread count (the FX-graph cache key of a CPU kernel includes
``torch.get_num_threads()``: kernels made for another count would never hit),
but on one core, with one inductor compile worker.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ... import _torch as compat
from ...plan.shapes import Shape, ShapePlan
from ..cache.save import save_new_compile_cache

__all__ = ["DONE", "ERROR", "Spec", "compile_shapes", "install_forward", "main", "shape_name"]

ERROR = "error.txt"
DONE = "done.json"


@dataclass(frozen=True)
class Spec:
    """Everything the background process needs; it must pickle (it crosses a spawn)."""

    build: Callable[[], torch.nn.Module]
    plan: ShapePlan
    example: Any
    step: Callable[[torch.nn.Module, Any], Any] | None
    compile_options: Mapping[str, Any]
    order: tuple[Shape, ...]
    threads: int
    limit: int
    out: str
    skip: frozenset[Shape] = field(default_factory=frozenset)


def shape_name(i: int, shape: Shape) -> str:
    """The name of the ``i``-th published shape: ``003-8x64``."""
    return f"{i:03d}-{shape.rows}x{shape.length}"


def install_forward(model: torch.nn.Module, forward: Callable[..., Any]) -> None:
    """Make ``model(...)`` call ``forward(*args, **kwargs)`` (an instance attribute, so hooks,
    ``state_dict`` and the parameters stay the model's own)."""
    model.forward = forward  # type: ignore[method-assign]


def compiled_forward(model: torch.nn.Module, options: Mapping[str, Any]) -> Callable[..., Any]:
    """``torch.compile(type(model).forward, dynamic=False, **options)``: the same function in
    both processes, so the training process traces the graph the background compiled."""
    return torch.compile(type(model).forward, dynamic=False, **options)  # type: ignore[no-any-return]


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return type(batch)({k: _to(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device) for v in batch)
    return batch


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def compile_shapes(spec: Spec) -> None:
    """Build the model and compile every shape of ``spec.order``, publishing each to
    ``spec.out`` as soon as it is compiled. Runs in the background process (or, for
    tests, in this one)."""
    out = Path(spec.out)
    start = time.perf_counter()
    model = spec.build()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"build() returned a {type(model).__name__}, not a torch.nn.Module")
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    fn = compiled_forward(model, spec.compile_options)
    install_forward(model, lambda *a, **k: fn(model, *a, **k))
    with compat.raised_recompile_limit(spec.limit):
        _settle(spec, model, device)
        _compile_each(spec, model, device)
    _atomic_write(out / DONE, json.dumps({"seconds": time.perf_counter() - start}))


def _run(spec: Spec, model: torch.nn.Module, batch: Any) -> None:
    from ..calls import run_batch

    if spec.step is not None:
        spec.step(model, batch)
    else:
        run_batch(model, None, batch, "compile_in_background")
    model.zero_grad(set_to_none=True)


def _settle(spec: Spec, model: torch.nn.Module, device: torch.device) -> None:
    """One run of the first shape with the compiler off, before anything compiles (as
    prewarm does): a model that sets its own state in its first call (transformers sets
    ``config.problem_type``) has every graph compiled in the state the training process's
    calls see (its first training call runs eagerly too)."""
    shape = spec.order[0]
    with torch.compiler.set_stance("force_eager"):
        _run(spec, model, _to(spec.plan.batch(spec.example, shape), device))


def _compile_each(spec: Spec, model: torch.nn.Module, device: torch.device) -> None:
    """Compile and publish each shape of ``spec.order`` not in ``spec.skip``."""
    out = Path(spec.out)
    exported: set[str] = set()
    for i, shape in enumerate(spec.order):
        if shape in spec.skip:
            continue
        t0 = time.perf_counter()
        batch = _to(spec.plan.batch(spec.example, shape), device)
        graphs = compat.unique_graphs()
        _run(spec, model, batch)
        seconds = time.perf_counter() - t0
        name = shape_name(i, shape)
        sizes = save_new_compile_cache(out / name, exported)
        info = {"shape": list(shape), "seconds": seconds, "graphs": compat.unique_graphs() - graphs}
        _atomic_write(out / f"{name}.json", json.dumps({**info, **sizes}))


def _pin_to_one_core() -> None:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cores:
        os.sched_setaffinity(0, {cores[-1]})


def main(spec: Spec) -> None:
    """The background process's entry point (``multiprocessing`` spawns it)."""
    try:
        _pin_to_one_core()
        torch.set_num_threads(spec.threads)
        compat.set_compile_threads(1)
        compile_shapes(spec)
    except BaseException:
        _atomic_write(Path(spec.out) / ERROR, traceback.format_exc())
        raise

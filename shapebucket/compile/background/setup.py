"""Checks and choices made before the background compile starts: what must pickle, the
compile options, the model, the order of the shapes, and the background's CPU share."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...errors import ShapeBucketError
from ...plan.shapes import Shape, ShapePlan

__all__ = ["check_model", "check_options", "check_picklable", "order_shapes", "yield_to_training"]

_NEEDS = (
    "the background process is spawned: it imports {what} by name, so define it at module "
    "level of an importable module (or of a script run as `python script.py` that guards its "
    "training under `if __name__ == '__main__':`), not as a lambda, a nested function or in a "
    "notebook"
)


def yield_to_training(pid: int) -> None:
    """Pin the background process to one core and lower its priority from its start (its
    own imports included), so the training process keeps the CPU it had."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    try:
        if cores:
            os.sched_setaffinity(pid, {cores[-1]})
        os.setpriority(os.PRIO_PROCESS, pid, 10)
    except (OSError, AttributeError):  # not Linux, or not permitted: the child pins itself
        pass


def order_shapes(plan: ShapePlan, sampler: Any) -> tuple[Shape, ...]:
    """Most frequent length first (the sampler's ``batch_buckets()``), else the plan's order."""
    if sampler is None:
        return plan.shapes
    if not callable(getattr(sampler, "batch_buckets", None)):
        raise ShapeBucketError(
            f"sampler must be a BucketBatchSampler or PackedBatchSampler (it gives "
            f"batch_buckets()), got {type(sampler).__name__}"
        )
    lengths, counts = np.unique(np.asarray(sampler.batch_buckets()), return_counts=True)
    count = dict(zip(lengths.tolist(), counts.tolist(), strict=True))
    return tuple(sorted(plan.shapes, key=lambda s: (-count.get(s.length, 0), s.length, s.rows)))


def check_picklable(**objects: Any) -> None:
    for what, obj in objects.items():
        in_main = callable(obj) and getattr(obj, "__module__", None) == "__main__"
        if in_main and getattr(sys.modules["__main__"], "__file__", None) is None:
            raise ShapeBucketError(f"{what}={obj!r}: " + _NEEDS.format(what=what))
        try:
            pickle.dumps(obj)
        except Exception as e:
            raise ShapeBucketError(
                f"{what} does not pickle ({type(e).__name__}: {e}); " + _NEEDS.format(what=what)
            ) from None


def check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ShapeBucketError(
            f"compile_options must be a dict of torch.compile arguments, got {options!r}"
        )
    if options.get("dynamic", False) is not False:
        raise ShapeBucketError(
            f"compile_options: dynamic={options['dynamic']!r}; the background compiles one static "
            "graph per shape of the plan (dynamic=False, set for you): leave dynamic out"
        )
    return {k: v for k, v in options.items() if k != "dynamic"}


def check_model(model: Any, build: Any) -> torch.nn.Module:
    model = build() if model is None else model
    if not isinstance(model, torch.nn.Module) or hasattr(model, "_orig_mod"):
        raise ShapeBucketError(
            f"compile_in_background trains a plain torch.nn.Module (it compiles it itself), got "
            f"{type(model).__name__}; pass model=None (build() makes it) or the uncompiled module"
        )
    if "forward" in vars(model):
        raise ShapeBucketError(
            f"{type(model).__name__}.forward is already replaced on this instance (by "
            "compile_regions or another compile_in_background?); pass a fresh model"
        )
    return model

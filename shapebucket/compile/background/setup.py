"""Checks and choices made before the background compile starts: what must pickle, the
options (:class:`BackgroundOptions`), the model, the order of the shapes and where the
compiled shapes go."""

from __future__ import annotations

import inspect
import os
import pickle
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ... import _torch as compat
from ..._validate import check_int, check_number
from ...errors import ShapeBucketError
from ...plan.shapes import Shape, ShapePlan
from ..cache.key import job_key

__all__ = [
    "BackgroundOptions",
    "check_model",
    "check_options",
    "check_picklable",
    "order_shapes",
    "output_dir",
]

_NEEDS = (
    "the background process is spawned: it imports {what} by name, so define it at module "
    "level of an importable module (or of a script run as `python script.py` that guards its "
    "training under `if __name__ == '__main__':`), not as a lambda, a nested function or in a "
    "notebook"
)


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
    """The ``torch.compile`` arguments without ``dynamic`` (refused unless False)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ShapeBucketError(
            f"compile_options must be a dict of torch.compile arguments, got {options!r}"
        )
    known = [n for n in inspect.signature(torch.compile).parameters if n != "model"]
    unknown = [k for k in options if k not in known]
    if unknown:  # else a TypeError in both processes, once training has started
        raise ShapeBucketError(
            f"compile_options has {unknown}, which torch.compile does not take (it takes "
            f"{known}); inductor settings go under options={{...}}"
        )
    if options.get("dynamic", False) is not False:
        raise ShapeBucketError(
            f"compile_options: dynamic={options['dynamic']!r}; the background compiles one static "
            "graph per shape of the plan (dynamic=False, set for you): leave dynamic out"
        )
    return {k: v for k, v in options.items() if k != "dynamic"}


@dataclass(frozen=True)
class BackgroundOptions:
    """How :func:`~shapebucket.compile.compile_in_background` compiles and publishes: the
    ``torch.compile`` arguments of both processes (``compile_options``; ``dynamic=False``
    is set for you), ``cache_dir`` (keep the compiled shapes in ``cache_dir/<key>`` for
    the next run; default: a temporary directory that ``close()`` removes) and
    ``poll_seconds`` (how often, at most, a training call looks for new shapes) and
    ``nice`` (the background process's niceness, 0-19: at 10 it compiles on what training
    leaves of its core; 0 shares the core equally, for a job whose data workers or other
    processes keep every core busy, where a compile at 10 waits behind them).

    >>> BackgroundOptions(compile_options={"backend": "eager"}, poll_seconds=0).poll_seconds
    0
    """

    compile_options: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: str | Path | None = None
    poll_seconds: float = 0.5
    nice: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "compile_options", check_options(self.compile_options))
        if self.cache_dir is not None and (
            not isinstance(self.cache_dir, (str, os.PathLike)) or not str(self.cache_dir).strip()
        ):
            raise ShapeBucketError(
                f"cache_dir must be a directory path, got {self.cache_dir!r}; pass a directory "
                "(created if missing) or leave cache_dir out"
            )
        check_number(
            "poll_seconds",
            self.poll_seconds,
            at_least=0,
            at_most=60,
            hint=" (seconds between polls)",
        )
        object.__setattr__(self, "nice", check_int("nice", self.nice, minimum=0, maximum=19))


def output_dir(
    options: BackgroundOptions, model: torch.nn.Module, step: Any, job: tuple[Any, ...]
) -> str:
    """Where the background publishes: a new temporary directory, or ``cache_dir/<key>``
    (created) where the key hashes the job: ``(plan, example, order)``, the model's and
    the step's code, the options and the thread count."""
    if options.cache_dir is None:
        return tempfile.mkdtemp(prefix="shapebucket-background-")
    plan, example, order = job
    batches = ((f"{s.rows}x{s.length}", plan.batch(example, s)) for s in order)
    extra = (
        f"background threads={torch.get_num_threads()} {sorted(options.compile_options.items())!r}"
    )
    out = Path(options.cache_dir) / job_key(model, step, batches, extra)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ShapeBucketError(
            f"cache_dir={str(options.cache_dir)!r} cannot hold the compiled shapes ({e.strerror}); "
            "pass a directory (created if missing) or leave cache_dir out"
        ) from None
    return str(out)


def check_model(model: Any, build: Any) -> torch.nn.Module:
    model = build() if model is None else model
    if not isinstance(model, torch.nn.Module) or compat.is_compiled_module(model):
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

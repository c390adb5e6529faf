"""Prewarm inside a Hugging Face ``Trainer``: :class:`PrewarmCallback` compiles every shape
at ``on_train_begin``, after the Trainer compiled the model, on ``trainer.model_wrapped``
through ``trainer.training_step``; :func:`~shapebucket.prewarm` puts the model, optimizer,
scheduler and RNGs back afterwards (``docs/integrations.md``).
"""

from __future__ import annotations

import copy
import os
from typing import Any

from transformers import TrainerCallback

from .. import _torch as compat
from ..compile.modes.base import Mode
from ..compile.modes.cached import Cache
from ..compile.prewarm import prewarm
from ..compile.report import PrewarmReport
from ..errors import ShapeBucketError
from ..plan.shapes import ShapePlan
from ._compat import counted, restore_counted

__all__ = ["PrewarmCallback", "compile_cache_dir", "prewarm_trainer"]


def compile_cache_dir(value: Any, output_dir: str | None) -> str | None:
    """The compile cache directory: ``True`` is ``<output_dir>/compile-cache``, ``False`` none.

    >>> compile_cache_dir(True, "out")
    'out/compile-cache'
    >>> compile_cache_dir(False, "out") is None
    True
    """
    if value is True:
        return os.path.join(output_dir or ".", "compile-cache")
    if value is False:
        return None
    if isinstance(value, (str, os.PathLike)) and str(value).strip():
        return str(value)
    raise ShapeBucketError(
        f"compile_cache must be True (<output_dir>/compile-cache), False (no cache) or a "
        f"directory, got {value!r}"
    )


def _example(trainer: Any) -> Any:
    """A real batch of one sample, made by a copy of the trainer's collate function (a
    copy starts its counters at zero, so ``collator.stats`` counts training batches only)."""
    dataset, collate = trainer.train_source()
    return copy.deepcopy(collate)([dataset[0]])


def prewarm_trainer(trainer: Any) -> PrewarmReport | None:
    """Compile every shape of ``trainer``'s plan on the model the Trainer compiled.

    Returns ``None`` (nothing to do) unless ``torch_compile=True``; the report is
    also ``trainer.prewarm_report``, and its time goes to the Trainer's log.
    """
    args = trainer.args
    model = trainer.model_wrapped
    if not args.torch_compile:
        return None
    if not compat.is_compiled_module(model):
        raise ShapeBucketError(
            f"{type(trainer).__name__}: torch_compile=True, but the model the Trainer trains "
            f"({type(model).__name__}) is not a torch.compile'd module, so there is nothing to "
            "prewarm; pass prewarm=False, or let the Trainer compile the model"
        )
    plan = ShapePlan.of(trainer.collator, trainer.sampler)
    modes: list[Mode] = []
    if trainer.compile_cache is not None:
        plugin = trainer.accelerator.state.dynamo_plugin.to_kwargs()
        modes.append(Cache(trainer.compile_cache, extra=repr(sorted(plugin.items(), key=str))))
    if not hasattr(trainer, "current_gradient_accumulation_steps"):
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps

    def step(batch: Any) -> None:  # what the training loop does with one batch
        _, count = trainer.get_batch_samples(iter([batch]), 1, args.device)
        trainer.training_step(model, batch, count)

    kept = counted(trainer)
    report = prewarm(
        model,
        plan,
        _example(trainer),
        step=step,
        restore=[o for o in (trainer.optimizer, trainer.lr_scheduler) if o is not None],
        modes=modes,
        progress=not args.disable_tqdm and trainer.is_local_process_zero(),
    )
    restore_counted(trainer, kept)
    trainer.prewarm_report = report
    trainer.log(
        {
            "prewarm_seconds": round(report.total_seconds + report.verify_seconds, 3),
            "prewarm_shapes": len(plan),
            "prewarm_graphs": report.total_graphs,
            "prewarm_cache_loaded": int(report.cache_loaded),
        }
    )
    return report


class PrewarmCallback(TrainerCallback):
    """Runs :func:`prewarm_trainer` when training begins (after the Trainer compiled the
    model, before the first step); added by the shapebucket trainers."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        prewarm_trainer(self.trainer)

"""What both shapebucket Trainers share: the DataLoader, the sampler's state in each
checkpoint, exact resume, static shapes and the prewarm (a subclass sets ``self.sampler``
and ``self.collator`` and calls :meth:`ShapeTrainer._setup_shapes`).

The prewarm runs from :class:`PrewarmCallback` at ``on_train_begin``, after the Trainer
compiled the model, on ``trainer.model_wrapped`` through ``trainer.training_step``;
:func:`~shapebucket.prewarm` puts the model, optimizer, scheduler and RNGs back afterwards
(``docs/integrations.md``)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from functools import partial
from typing import Any

import numpy as np
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, seed_worker

from .. import _torch as compat
from .._hf import (
    CheckpointHook,
    collator_without_unused_columns,
    counted,
    dataset_without_unused_columns,
    restore_counted,
)
from .._lengths import check_lengths
from .._validate import check_flag
from ..collate.bucket import BucketCollator
from ..collate.packed import PackedCollator
from ..compile.modes.base import Mode
from ..compile.modes.cached import Cache
from ..compile.prewarm import prewarm
from ..compile.report import PrewarmReport
from ..errors import ShapeBucketError
from ..plan.shapes import ShapePlan
from ..sampling.base import ResumableBatchSampler

__all__ = ["STATE_FILE", "PrewarmCallback", "ShapeTrainer", "compile_cache_dir", "prewarm_trainer"]

#: The file, in each Trainer checkpoint, that holds the sampler's state (one per rank).
STATE_FILE = "shapebucket_sampler_rank{rank}.json"


class _EpochDataLoader(DataLoader):
    """A ``DataLoader`` whose ``set_epoch`` (the Trainer calls it) reaches the sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]


def _dataset_lengths(dataset: Any) -> np.ndarray:
    """One length per sample of ``dataset``: ``len(sample["input_ids"])`` (a column read
    for a ``datasets.Dataset``)."""
    if dataset is None:
        raise ShapeBucketError("lengths=None reads them from train_dataset, but there is none")
    try:
        column = dataset["input_ids"] if hasattr(dataset, "column_names") else None
        if column is None:
            column = [dataset[i]["input_ids"] for i in range(len(dataset))]
        return np.asarray([len(x) for x in column], dtype=np.int64)
    except (KeyError, TypeError, IndexError) as e:
        raise ShapeBucketError(
            f"lengths=None reads len(sample['input_ids']) from train_dataset, which failed ({e}); "
            "pass lengths= (one int per training sample)"
        ) from None


class ShapeTrainer(CheckpointHook, Trainer):
    """What both trainers share (this module's docstring)."""

    sampler: ResumableBatchSampler
    collator: BucketCollator | PackedCollator

    def _setup_shapes(self, lengths: Any, prewarm: bool, compile_cache: str | bool) -> np.ndarray:
        """Check the lengths against the dataset; register the prewarm (it runs when
        training starts, on the model the Trainer compiled)."""
        arr = _dataset_lengths(self.train_dataset) if lengths is None else check_lengths(lengths)
        if self.train_dataset is not None and len(arr) != len(self.train_dataset):  # type: ignore[arg-type]
            raise ShapeBucketError(
                f"lengths has {len(arr)} entries but train_dataset has {len(self.train_dataset)}; "  # type: ignore[arg-type]
                "pass one length per training sample"
            )
        check_flag("prewarm", prewarm)
        self.compile_cache = compile_cache_dir(compile_cache, self.args.output_dir)
        self.prewarm_report = None
        if prewarm:
            self.add_callback(PrewarmCallback(self))
        return arr

    def train_source(self) -> tuple[Any, Any]:
        """``(dataset, collate)``: what the training DataLoader reads, after the Trainer's
        removal of the columns the model does not take; the prewarm's example batch too.

        Example::

            dataset, collate = trainer.train_source()
            batch = collate([dataset[0]])
        """
        if self.train_dataset is None:
            raise ShapeBucketError(f"{type(self).__name__}: training requires a train_dataset")
        dataset: Any = self.train_dataset
        collate: Any = self.collator
        try:
            import datasets

            is_hf_dataset = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_hf_dataset = False
        if is_hf_dataset:
            dataset = dataset_without_unused_columns(self, dataset)
        else:
            collate = collator_without_unused_columns(self, collate)
        return dataset, collate

    def get_train_dataloader(self) -> DataLoader:
        dataset, collate = self.train_source()
        args = self.args
        workers = args.dataloader_num_workers
        options: dict[str, Any] = {
            "num_workers": workers,
            "pin_memory": args.dataloader_pin_memory,
            "worker_init_fn": partial(seed_worker, num_workers=workers, rank=args.process_index),
        }
        if workers > 0:  # DataLoader refuses these without workers
            options["persistent_workers"] = args.dataloader_persistent_workers
            options["prefetch_factor"] = args.dataloader_prefetch_factor
            options["multiprocessing_context"] = args.dataloader_multiprocessing_context
        if getattr(args, "dataloader_in_order", None) is not None:
            options["in_order"] = args.dataloader_in_order
        return _EpochDataLoader(dataset, batch_sampler=self.sampler, collate_fn=collate, **options)

    def _sampler_state_at(self, global_step: int) -> dict[str, Any]:
        """The sampler's state after ``global_step`` optimizer steps, computed the way the
        Trainer computes where to resume (its prefetching workers run ahead of it)."""
        accumulate = self.args.gradient_accumulation_steps
        per_epoch = max(-(-len(self.sampler) // accumulate), 1)
        position = min((global_step % per_epoch) * accumulate, len(self.sampler))
        state = self.sampler.state_dict()
        state.update(epoch=global_step // per_epoch, position=position)
        return state

    def after_checkpoint(self, output_dir: str) -> None:
        """The sampler's state beside the checkpoint just saved (one file per rank)."""
        folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        path = os.path.join(folder, STATE_FILE.format(rank=self.args.process_index))
        with open(path, "w") as f:
            json.dump(self._sampler_state_at(self.state.global_step), f)

    def _training(self) -> contextlib.AbstractContextManager[Any]:
        """The block ``train()`` runs in: dynamo's automatic dynamic shapes off, so each
        shape gets its own static graph (the Trainer compiles with ``dynamic=None``)."""
        return compat.automatic_dynamic(not self.args.torch_compile)

    def train(
        self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        if resume_from_checkpoint:
            folder = (
                get_last_checkpoint(self.args.output_dir)
                if resume_from_checkpoint is True
                else resume_from_checkpoint
            )
            if folder:
                self._check_checkpoint(str(folder))
        with self._training():
            return super().train(resume_from_checkpoint, *args, **kwargs)

    def _check_checkpoint(self, folder: str) -> None:
        path = os.path.join(folder, STATE_FILE.format(rank=self.args.process_index))
        if not os.path.isfile(path):
            raise ShapeBucketError(
                f"checkpoint {folder!r} has no {os.path.basename(path)}: it was not saved by a "
                f"{type(self).__name__} with this world size, so its batch order cannot be "
                "checked; resume from such a checkpoint, or start training afresh"
            )
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
            seed, _, _ = self.sampler.check_state(state)
        except ValueError as e:  # a truncated or edited file: JSON, UTF-8, or the state's check
            raise ShapeBucketError(
                f"checkpoint {folder!r}: {os.path.basename(path)} is not a sampler state this "
                f"trainer can resume from ({type(e).__name__}: {str(e)[:400]}); resume from "
                "another checkpoint, or start training afresh"
            ) from None
        if seed != self.sampler.seed:
            raise ShapeBucketError(
                f"checkpoint {folder!r} was trained with seed {seed}, this trainer has seed "
                f"{self.sampler.seed}: the resumed epoch would have another order and "
                f"repeat or skip samples; pass TrainingArguments(seed={seed})"
            )


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

    # a real batch of one sample, by a copy of the collate function (a copy starts its
    # counters at zero, so collator.stats counts training batches only)
    dataset, collate = trainer.train_source()
    kept = counted(trainer)
    report = prewarm(
        model,
        plan,
        copy.deepcopy(collate)([dataset[0]]),
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

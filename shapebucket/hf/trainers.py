"""Hugging Face ``transformers.Trainer`` integration (needs the ``hf`` extra).

``Trainer`` builds its own sampler and collator; the supported way to change the
training batches is to override ``get_train_dataloader``, which
:class:`BucketTrainer` (one sample per row, padded to a bucket) and
:class:`PackedTrainer` (whole samples packed into rows of a few row lengths) do.
Both share checkpoints, exact resume and, with ``torch_compile=True``, a prewarm of
every shape before the first step (:mod:`shapebucket.hf.prewarm`). Import them
from ``shapebucket.hf`` (the top-level package never imports transformers).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, seed_worker

from .. import _torch as compat
from .._validate import check_flag, check_lengths
from ..collate.bucket import BucketCollator
from ..collate.packed import PackedCollator
from ..compile.calls import refuse_cached_decoder
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets, as_buckets
from ..fit.packing_fit import PackingFitReport
from ..sampling.base import ResumableBatchSampler
from ..sampling.bucket import BucketBatchSampler
from ..sampling.packed import PackedBatchSampler
from ._compat import (
    CheckpointHook,
    collator_without_unused_columns,
    dataset_without_unused_columns,
)
from .packing import Packing
from .prewarm import PrewarmCallback, check_compile_cache

__all__ = ["BucketTrainer", "PackedTrainer"]

#: The file, in each Trainer checkpoint, that holds the sampler's state (one per rank).
STATE_FILE = "shapebucket_sampler_rank{rank}.json"


class _EpochDataLoader(DataLoader):
    """A ``DataLoader`` with ``set_epoch``, which the Trainer calls at every epoch and
    forwards here to the batch sampler (a plain DataLoader has none, so the sampler
    would never hear of the epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]


def _dataset_lengths(dataset: Any, key: str = "input_ids") -> np.ndarray:
    """One length per sample of ``dataset``: ``len(sample[key])`` (a column read for a
    ``datasets.Dataset``)."""
    if dataset is None:
        raise ShapeBucketError("lengths=None reads them from train_dataset, but there is none")
    try:
        column = dataset[key] if hasattr(dataset, "column_names") else None
        if column is None:
            column = [dataset[i][key] for i in range(len(dataset))]
        return np.asarray([len(x) for x in column], dtype=np.int64)
    except (KeyError, TypeError, IndexError) as e:
        raise ShapeBucketError(
            f"lengths=None reads len(sample[{key!r}]) from train_dataset, which failed ({e}); "
            "pass lengths= (one int per training sample)"
        ) from None


class _ShapeTrainer(CheckpointHook, Trainer):
    """What both trainers share: the DataLoader, checkpoints, resume, static shapes and
    the prewarm (a subclass sets ``self.sampler`` and ``self.collator``)."""

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
        self.compile_cache = check_compile_cache(compile_cache, self.args.output_dir)
        self.prewarm_report = None
        if prewarm:
            self.add_callback(PrewarmCallback(self))
        return arr

    def train_source(self) -> tuple[Any, Any]:
        """``(dataset, collate)``: what the training DataLoader reads, after the Trainer's
        removal of the columns the model does not take (from the dataset, or by wrapping
        the collator). The prewarm makes its example batch from these, so it sees exactly
        the keys training does.

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


class BucketTrainer(_ShapeTrainer):
    """A ``Trainer`` whose training batches come from :class:`BucketBatchSampler`
    and :class:`BucketCollator` (``trainer.sampler``, ``trainer.collator``).

    * The sampler uses ``per_device_train_batch_size``, ``seed``, and the
      world size and rank of the Trainer's arguments; it shards by itself, so
      the DataLoader is not re-sharded by ``accelerate``.
    * Short batches are padded to the full batch size (``rows``)
      without a ``sample_mask`` key, which models would reject: pad rows have
      an all-False attention mask and labels -100, so the loss ignores them.
    * Epochs: the Trainer's ``set_epoch`` reaches the sampler, so every epoch has
      its own order (from ``seed`` and the epoch). The DataLoader gets the
      Trainer's loader options and its removal of columns the model does not take.
    * Checkpoints: each holds the sampler's state (``shapebucket_sampler_rank{r}.json``),
      checked on ``train(resume_from_checkpoint=...)`` against this trainer's sampler
      (same lengths, buckets, batch size, world size and seed, else a
      :class:`ShapeBucketError`); the Trainer then skips the batches already
      trained, which is exact because an epoch's order depends on ``(seed, epoch)`` alone.
    * With ``torch_compile=True``: dynamo's automatic dynamic shapes are off during
      ``train()``, so each bucket gets one static graph, and every shape of the plan
      is compiled before the first step (``prewarm=True``), through the Trainer's own
      compiled model and ``training_step``, with the compiler's cache in
      ``compile_cache`` (default ``<output_dir>/compile-cache``; ``False``: none).
      ``trainer.prewarm_report`` is the :class:`~shapebucket.compile.report.PrewarmReport`.

    Example (see ``docs/examples/hf_trainer.py`` for a full run)::

        trainer = BucketTrainer(model=model, args=TrainingArguments(..., torch_compile=True),
                                train_dataset=ds, lengths=lengths, buckets=buckets)
        trainer.train()
    """

    def __init__(
        self,
        *args: Any,
        lengths: Sequence[int] | np.ndarray | None = None,
        buckets: Buckets | Sequence[int],
        pad_values: Mapping[str, Any] | None = None,
        leftovers: str = "keep",
        prewarm: bool = True,
        compile_cache: str | bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        arr = self._setup_shapes(lengths, prewarm, compile_cache)
        self.buckets = as_buckets(buckets)
        self.sampler = BucketBatchSampler(
            arr,
            self.buckets,
            rows=self.args.per_device_train_batch_size,
            seed=self.args.seed,
            drop_last=self.args.dataloader_drop_last,
            leftovers=leftovers,  # type: ignore[arg-type]
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
        )
        self.collator = BucketCollator(self.buckets, pad_values=pad_values, rows=self.sampler.rows)


#: The keywords PackedTrainer took before its constructors (refused with the fix).
_SHAPE_KEYWORDS = ("fit", "buckets", "rows", "tokens_per_batch")
_T = TypeVar("_T", bound="PackedTrainer")


class PackedTrainer(_ShapeTrainer):
    """A ``Trainer`` whose training batches are packed: :class:`PackedBatchSampler` and
    :class:`PackedCollator`, at most ``len(buckets)`` shapes.

    Build it with one of three constructors, each taking the ``Trainer``'s arguments
    after its own: :meth:`from_fit` (``fit_packing``'s result), :meth:`from_rows` (row
    lengths and rows per batch) or :meth:`from_tokens` (a token budget per batch; the
    row lengths are fitted to the training set unless given). ``lengths=None`` reads
    ``len(sample["input_ids"])`` from the training set. ``per_device_train_batch_size``
    is not used: a batch is ``rows[L]`` rows of ``L`` tokens. The defaults are the
    safe ones for a Hugging Face causal LM:

    * no ``attention_mask`` (the collator refuses samples that carry one); each
      token's ``position_ids`` restart at 0 for every sample, which is how a
      Hugging Face decoder finds the samples of a row and masks attention by them;
      ``document_ids`` is left out (HF models take no such argument);
    * ``label_shift="model"``: the model shifts labels, so the first label of each
      sample becomes -100 and no token learns to predict the next sample;
    * ``train()`` refuses a model whose ``config.use_cache`` is True: a decoder
      keeping a cache ignores packed ``position_ids``, and every sample would attend
      to the ones before it in its row. The Trainer (transformers 5) already copies
      ``TrainingArguments.use_cache`` (default False) into the model's config, so a
      True there was asked for explicitly: refused with the fix rather than
      overridden behind the user's back.

    One window packs the whole training set, so every epoch has the same number of
    batches (the Trainer counts them once, at the start). Checkpoints, resume,
    epochs, the DataLoader and ``prewarm``/``compile_cache`` are as for
    :class:`BucketTrainer`.
    """

    def __init__(
        self,
        *args: Any,
        packing: Packing | None = None,
        lengths: Sequence[int] | np.ndarray | None = None,
        pad_values: Mapping[str, Any] | None = None,
        label_shift: str = "model",
        prewarm: bool = True,
        compile_cache: str | bool = True,
        **kwargs: Any,
    ) -> None:
        old = [k for k in _SHAPE_KEYWORDS if k in kwargs]
        if old or not isinstance(packing, Packing):
            raise ShapeBucketError(
                f"{type(self).__name__} gets its row lengths from one of its constructors"
                f"{f' (got {old})' if old else ''}: {type(self).__name__}.from_fit(fit, ...), "
                ".from_rows(buckets, rows, ...) or .from_tokens(tokens_per_batch, ...), each "
                "followed by the Trainer's arguments"
            )
        super().__init__(*args, **kwargs)
        arr = self._setup_shapes(lengths, prewarm, compile_cache)
        self.packing = packing
        self.buckets, rows = packing.resolve(arr)
        self.sampler = PackedBatchSampler(
            arr,
            self.buckets,
            rows=rows,
            seed=self.args.seed,
            window=max(len(arr), 1),
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
        )
        self.collator = PackedCollator(
            self.buckets,
            rows=self.sampler.rows,
            pad_values=pad_values,
            document_key=None,
            label_shift=label_shift,  # type: ignore[arg-type]
        )

    @classmethod
    def from_fit(cls: type[_T], fit: PackingFitReport, *args: Any, **kwargs: Any) -> _T:
        """A trainer whose row lengths and rows per batch are ``fit``'s (what
        :func:`~shapebucket.fit_packing` returned); ``args`` and ``kwargs`` are the
        ``Trainer``'s and :class:`PackedTrainer`'s (``lengths``, ``pad_values``, ...).

        Example::

            trainer = PackedTrainer.from_fit(fit_packing(lengths, tokens_per_batch=8192),
                                             model=model, args=args, train_dataset=ds)
        """
        return cls(*args, packing=Packing(fit=fit), **kwargs)

    @classmethod
    def from_rows(
        cls: type[_T],
        buckets: Buckets | Sequence[int],
        rows: int | Mapping[int, int],
        *args: Any,
        **kwargs: Any,
    ) -> _T:
        """A trainer with these row lengths (``buckets``) and ``rows`` rows per batch (one
        int, or one per row length).

        Example::

            trainer = PackedTrainer.from_rows([256, 512], {256: 8, 512: 4},
                                              model=model, args=args, train_dataset=ds)
        """
        return cls(*args, packing=Packing(buckets=as_buckets(buckets), rows=rows), **kwargs)

    @classmethod
    def from_tokens(
        cls: type[_T],
        tokens_per_batch: int,
        *args: Any,
        buckets: Buckets | Sequence[int] | None = None,
        **kwargs: Any,
    ) -> _T:
        """A trainer whose batches hold about ``tokens_per_batch`` tokens each, in rows of
        ``buckets`` (the row lengths) or, when ``None``, of the lengths
        :func:`~shapebucket.fit_packing` fits to the training set's lengths.

        Example::

            trainer = PackedTrainer.from_tokens(8192, model=model, args=args, train_dataset=ds)
        """
        chosen = None if buckets is None else as_buckets(buckets)
        return cls(
            *args, packing=Packing(buckets=chosen, tokens_per_batch=tokens_per_batch), **kwargs
        )

    def _training(self) -> contextlib.AbstractContextManager[Any]:
        refuse_cached_decoder(self.model, "PackedTrainer")
        return super()._training()

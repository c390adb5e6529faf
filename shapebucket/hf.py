"""Hugging Face ``transformers.Trainer`` integration (needs the ``hf`` extra).

``Trainer`` builds its own sampler and collator; the supported way to change the
training batches is to override ``get_train_dataloader``, which
:class:`BucketTrainer` does. Import it from ``shapebucket.hf`` (the top-level
package never imports transformers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, seed_worker

from . import _torch_compat as compat
from .collate.bucket import BucketCollator
from .errors import ShapeBucketError
from .plan.buckets import Buckets, as_buckets
from .sampling.bucket import BucketBatchSampler

__all__ = ["BucketTrainer"]

#: The file, in each Trainer checkpoint, that holds the sampler's state (one per rank).
STATE_FILE = "shapebucket_sampler_rank{rank}.json"


class _EpochDataLoader(DataLoader):
    """A ``DataLoader`` with ``set_epoch``, which the Trainer calls at every epoch and
    forwards here to the bucket sampler (a plain DataLoader has none, so the sampler
    would never hear of the epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]


class BucketTrainer(Trainer):
    """A ``Trainer`` whose training batches come from :class:`BucketBatchSampler`
    and :class:`BucketCollator`.

    * The sampler uses ``per_device_train_batch_size``, ``seed``, and the
      world size and rank of the Trainer's arguments; it shards by itself, so
      the DataLoader is not re-sharded by ``accelerate``.
    * Short batches are padded to the full batch size (``rows``)
      without a ``sample_mask`` key, which models would reject: pad rows have
      an all-False attention mask and labels -100, so the loss ignores them.
    * Epochs: the Trainer's ``set_epoch`` reaches the sampler, so every epoch has
      its own order (from ``seed`` and the epoch). The DataLoader gets the
      Trainer's options (workers, ``pin_memory``, ``persistent_workers``,
      ``prefetch_factor``, ``multiprocessing_context``, ``in_order``, its
      ``worker_init_fn``) and the Trainer's removal of columns the model does
      not take.
    * Checkpoints: each holds the sampler's state (``shapebucket_sampler_rank{r}.json``:
      epoch, batches done, seed, configuration fingerprint). On
      ``train(resume_from_checkpoint=...)`` it is checked against this trainer's
      sampler (same lengths, buckets, batch size, world size and seed, else a
      :class:`ShapeBucketError`); the Trainer then skips the batches already
      trained, which is exact because an epoch's order depends on
      ``(seed, epoch)`` alone.
    * With ``torch_compile=True`` the Trainer compiles with ``dynamic=None``;
      ``BucketTrainer.train`` switches dynamo's automatic dynamic shapes off for
      its duration, so every bucket gets its own static graph (at most
      ``len(buckets)``) instead of one dynamic graph after the second shape.

    Example (see ``docs/examples/hf_trainer.py`` for a full run)::

        trainer = BucketTrainer(model=model, args=TrainingArguments(..., torch_compile=True),
                                train_dataset=ds, lengths=lengths, buckets=buckets)
        trainer.train()
    """

    def __init__(
        self,
        *args: Any,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        pad_values: Mapping[str, Any] | None = None,
        leftovers: str = "keep",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.buckets = as_buckets(buckets)
        if self.train_dataset is not None and len(lengths) != len(self.train_dataset):  # type: ignore[arg-type]
            raise ShapeBucketError(
                f"lengths has {len(lengths)} entries but train_dataset has {len(self.train_dataset)}; "  # type: ignore[arg-type]
                "pass one length per training sample"
            )
        self.bucket_sampler = BucketBatchSampler(
            lengths,
            self.buckets,
            batch_size=self.args.per_device_train_batch_size,
            seed=self.args.seed,
            drop_last=self.args.dataloader_drop_last,
            leftovers=leftovers,  # type: ignore[arg-type]
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
        )
        self.bucket_collator = BucketCollator(
            self.buckets,
            pad_values=pad_values,
            rows=self.bucket_sampler.rows,
        )

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ShapeBucketError("BucketTrainer: training requires a train_dataset")
        dataset: Any = self.train_dataset
        collate: Any = self.bucket_collator
        try:
            import datasets

            is_hf_dataset = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_hf_dataset = False
        if is_hf_dataset:
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collate = self._get_collator_with_removed_columns(collate, description="Training")
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
        return _EpochDataLoader(
            dataset, batch_sampler=self.bucket_sampler, collate_fn=collate, **options
        )

    def _sampler_state_at(self, global_step: int) -> dict[str, Any]:
        """The sampler's state after ``global_step`` optimizer steps, computed the way the
        Trainer computes where to resume (its prefetching workers run ahead of it)."""
        accumulate = self.args.gradient_accumulation_steps
        per_epoch = max(-(-len(self.bucket_sampler) // accumulate), 1)
        position = min((global_step % per_epoch) * accumulate, len(self.bucket_sampler))
        state = self.bucket_sampler.state_dict()
        state.update(epoch=global_step // per_epoch, position=position)
        return state

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        path = os.path.join(folder, STATE_FILE.format(rank=self.args.process_index))
        with open(path, "w") as f:
            json.dump(self._sampler_state_at(self.state.global_step), f)

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
        with compat.automatic_dynamic(not self.args.torch_compile):
            return super().train(resume_from_checkpoint, *args, **kwargs)

    def _check_checkpoint(self, folder: str) -> None:
        path = os.path.join(folder, STATE_FILE.format(rank=self.args.process_index))
        if not os.path.isfile(path):
            raise ShapeBucketError(
                f"checkpoint {folder!r} has no {os.path.basename(path)}: it was not saved by a "
                "BucketTrainer with this world size, so its batch order cannot be checked; resume "
                "from a BucketTrainer checkpoint, or start training afresh"
            )
        with open(path) as f:
            state = json.load(f)
        seed, _, _ = self.bucket_sampler._check_state(state)
        if seed != self.bucket_sampler.seed:
            raise ShapeBucketError(
                f"checkpoint {folder!r} was trained with seed {seed}, this trainer has seed "
                f"{self.bucket_sampler.seed}: the resumed epoch would have another order and "
                f"repeat or skip samples; pass TrainingArguments(seed={seed})"
            )

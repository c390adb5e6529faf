"""Hugging Face ``transformers.Trainer`` integration (needs the ``hf`` extra).

``Trainer`` builds its own sampler and collator; the supported way to change the
training batches is to override ``get_train_dataloader``, which
:class:`BucketTrainer` does. Import it from ``shapebucket.hf`` (the top-level
package never imports transformers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader
from transformers import Trainer

from . import _torch_compat as compat
from .buckets import Buckets, as_buckets
from .collate import BucketCollator
from .errors import ShapeBucketError
from .sampler import BucketBatchSampler

__all__ = ["BucketTrainer"]


class BucketTrainer(Trainer):
    """A ``Trainer`` whose training batches come from :class:`BucketBatchSampler`
    and :class:`BucketCollator`.

    * The sampler uses ``per_device_train_batch_size``, ``seed``, and the
      world size and rank of the Trainer's arguments; it shards by itself, so
      the DataLoader is not re-sharded by ``accelerate``.
    * Short batches are padded to the full batch size (``batch_sizes``)
      without a ``sample_mask`` key, which models would reject: pad rows have
      an all-False attention mask and labels -100, so the loss ignores them.
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
            batch_sizes=self.bucket_sampler.batch_sizes,
            sample_mask_key=None,
        )

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ShapeBucketError("BucketTrainer: training requires a train_dataset")
        return DataLoader(
            self.train_dataset,  # type: ignore[arg-type]
            batch_sampler=self.bucket_sampler,
            collate_fn=self.bucket_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )

    def train(self, *args: Any, **kwargs: Any) -> Any:
        with compat.automatic_dynamic(not self.args.torch_compile):
            return super().train(*args, **kwargs)

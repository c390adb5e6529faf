"""Hugging Face ``transformers.Trainer`` integration (needs the ``hf`` extra).

``Trainer`` builds its own sampler and collator; the supported way to change the
training batches is to override ``get_train_dataloader``, which
:class:`BucketTrainer` (one sample per row, padded to a bucket) and
:class:`PackedTrainer` (whole samples packed into rows of a few row lengths) do.
Both share checkpoints, exact resume and, with ``torch_compile=True``, a prewarm of
every shape before the first step (:class:`~shapebucket.hf.base.ShapeTrainer`,
:mod:`shapebucket.hf.prewarm`). Import them
from ``shapebucket.hf`` (the top-level package never imports transformers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ..collate.bucket import BucketCollator
from ..collate.packed import PackedCollator
from ..compile.calls import refuse_cached_decoder
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets, as_buckets
from ..fit.packing_fit import PackingFitReport
from ..sampling.bucket import BucketBatchSampler
from ..sampling.packed import PackedBatchSampler
from .base import ShapeTrainer
from .packing import Packing

__all__ = ["BucketTrainer", "PackedTrainer"]


class BucketTrainer(ShapeTrainer):
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


class PackedTrainer(ShapeTrainer):
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

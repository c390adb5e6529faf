"""``BucketTrainer`` and ``PackedTrainer``: a ``transformers.Trainer`` fed shapebucket's
batches through ``get_train_dataloader`` (what they share: :mod:`.base`, :mod:`.prewarm`;
what they do and why: ``docs/integrations.md``)."""

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
    and :class:`BucketCollator` (``trainer.sampler``, ``trainer.collator``), sized by
    ``per_device_train_batch_size`` and seeded, sharded and resumed from the Trainer's
    arguments; each checkpoint holds the sampler's state, checked on resume. With
    ``torch_compile=True`` each bucket gets one static graph, all compiled before the first
    step (``docs/integrations.md`` says what and why).

    Args:
        lengths: one length per training sample (default: ``len(sample["input_ids"])``).
        buckets: the bucket lengths.
        pad_values, leftovers: as for :class:`BucketCollator` and
            :class:`BucketBatchSampler`.
        prewarm: compile every shape before the first step (with ``torch_compile=True``);
            ``trainer.prewarm_report`` is its :class:`~shapebucket.compile.report.PrewarmReport`.
        compile_cache: the compiler's cache directory (``True``:
            ``<output_dir>/compile-cache``; ``False``: none).

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
    :class:`PackedCollator`, at most ``len(buckets)`` shapes, one window over the whole
    training set (every epoch has the same number of batches).

    Build it with one of three constructors, each taking the ``Trainer``'s arguments
    after its own: :meth:`from_fit` (``fit_packing``'s result), :meth:`from_rows` (row
    lengths and rows per batch) or :meth:`from_tokens` (a token budget per batch; the
    row lengths are fitted to the training set unless given). ``lengths``, ``pad_values``,
    ``prewarm`` and ``compile_cache`` are as for :class:`BucketTrainer`;
    ``per_device_train_batch_size`` is not used. The defaults suit a Hugging Face causal
    LM: no ``attention_mask``, ``position_ids`` restarting for every sample,
    ``label_shift="model"``, and ``train()`` refuses ``config.use_cache=True``
    (``docs/integrations.md``).
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
        :func:`~shapebucket.fit_packing` returned).

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

"""``BucketTrainer``, and ``PackedTrainer`` with ``Packing`` (its row lengths and rows): a
``transformers.Trainer`` fed shapebucket's batches through ``get_train_dataloader`` (what
they share: :mod:`.base`; what they do and why: ``docs/integrations.md``)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from .._validate import check_int, rows_per_key
from ..collate.bucket import BucketCollator
from ..collate.packed import PackedCollator
from ..compile.calls import refuse_cached_decoder
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets, as_buckets
from ..fit.packing import rows_for_tokens
from ..fit.packing_fit import PackingFitReport, fit_packing
from ..sampling.bucket import BucketBatchSampler
from ..sampling.packed import PackedBatchSampler
from .base import ShapeTrainer

__all__ = ["BucketTrainer", "PackedTrainer", "Packing"]


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


@dataclass(frozen=True)
class Packing:
    """Where a :class:`PackedTrainer` gets its row lengths and rows per batch: a fit
    (``fit``), row lengths with rows per batch (``buckets``, ``rows``), or a token budget
    per batch (``tokens_per_batch``, with the row lengths in ``buckets`` or, when
    ``None``, fitted to the training set's lengths). Made by the trainer's constructors
    (:meth:`PackedTrainer.from_fit`, :meth:`~PackedTrainer.from_rows`,
    :meth:`~PackedTrainer.from_tokens`); ``trainer.packing`` is the one it was built with.

    >>> Packing(buckets=Buckets([32]), rows=2).resolve([5, 9, 30])
    (Buckets([32]), 2)
    """

    fit: PackingFitReport | None = None
    buckets: Buckets | None = None
    rows: int | Mapping[int, int] | None = None
    tokens_per_batch: int | None = None

    def __post_init__(self) -> None:
        if self.fit is not None and not isinstance(self.fit, PackingFitReport):
            raise ShapeBucketError(
                f"fit must be what fit_packing(...) returned, got {type(self.fit).__name__}"
            )
        given = [k for k in ("buckets", "rows", "tokens_per_batch") if getattr(self, k) is not None]
        if self.fit is not None and given:
            raise ShapeBucketError(
                f"Packing(fit=...) holds the row lengths and rows: pass it alone, not with {given}"
            )
        if self.fit is None and (self.rows is None) == (self.tokens_per_batch is None):
            raise ShapeBucketError(
                "Packing needs fit=fit_packing(...), buckets= with rows=, or tokens_per_batch= "
                f"(with or without buckets=), got {given or 'nothing'}; build the trainer with "
                "PackedTrainer.from_fit, from_rows or from_tokens"
            )
        if self.rows is not None and self.buckets is None:
            raise ShapeBucketError("Packing(rows=...) needs buckets= (the row lengths)")
        # checked here, before the Trainer is built (the sampler would refuse them later)
        if self.tokens_per_batch is not None:
            check_int("tokens_per_batch", self.tokens_per_batch, minimum=1)
        if self.rows is not None and self.buckets is not None:
            rows_per_key(self.rows, as_buckets(self.buckets).lengths)

    def resolve(self, lengths: Any) -> tuple[Buckets, Any]:
        """``(buckets, rows)`` for the sampler, fitting the row lengths to ``lengths`` when
        only ``tokens_per_batch`` was given."""
        fit, tokens = self.fit, cast(int, self.tokens_per_batch)
        if fit is None and self.buckets is None:  # a budget alone (__post_init__ checked)
            fit = fit_packing(lengths, tokens_per_batch=tokens)
        if fit is not None:
            return fit.buckets, fit.rows
        buckets = cast(Buckets, self.buckets)
        return buckets, rows_for_tokens(buckets, tokens) if self.rows is None else self.rows


#: Packing's keywords: refused beside a constructor (which passes them itself).
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

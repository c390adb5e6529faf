"""``Packing``: where a :class:`~shapebucket.hf.PackedTrainer` gets its row lengths and
rows per batch (one record for the trainer's three constructors)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from .._validate import check_int
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets
from ..fit.packing import rows_by_length, rows_for_tokens
from ..fit.packing_fit import PackingFitReport, fit_packing

__all__ = ["Packing"]


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
            rows_by_length(self.buckets, self.rows)

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

"""Bucketed models: any model's calls padded to a few planned shapes, outputs cut back.

Why a two-length call is not planned by the cell planner (:class:`~shapebucket.fit.Cells`):
the wrapper takes one bucket table and pads each side of a call (source, target) to its
own smallest bucket that holds it, so its shapes are the full ``rows x K x K`` grid. On
a full grid the cell planner's edge rule (the cheapest cell that holds both lengths) is
that same per-side lookup, so routing through ``Cells`` would add a search over ``K**2``
cells to every call and change no shape. What the cell planner would add is a fitted,
smaller table, which needs both lengths of every sample before the first call: that is
a new argument (``cells=``, fitted by :func:`~shapebucket.fit.fit_cells`), not a refactor.

``model.stats`` (a :class:`~shapebucket.bucketed.stats.BucketedReport`) says what the
wrapper padded; the record is returned, never built, so it is not exported here.
:func:`fit_calls` fits the wrapper's buckets and row buckets from recorded calls (its
:class:`~shapebucket.bucketed.fitting.CallShapes` is returned, not exported either).

>>> import shapebucket.bucketed as sb
>>> sb.__all__
['BucketedModel', 'fit_calls']
"""

from .fitting import fit_calls
from .model import BucketedModel

__all__ = ["BucketedModel", "fit_calls"]

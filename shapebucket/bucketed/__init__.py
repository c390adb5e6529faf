"""Bucketed models: any model's calls padded to a few planned shapes, outputs cut back.

A two-length call pads each side to its own bucket of the one table (why not
:class:`~shapebucket.fit.Cells`: ``docs/bucketed.md``, "What a call does", step 2).

``model.stats`` (a :class:`~shapebucket.bucketed.stats.BucketedReport`) says what the
wrapper padded; the record is returned, never built, so it is not exported here.
:func:`fit_calls` fits the wrapper's buckets and row buckets from recorded calls (its
:class:`~shapebucket.bucketed.fitting.CallShapes` is returned, not exported either).
"""

from .fitting import fit_calls
from .model import BucketedModel

__all__ = ["BucketedModel", "fit_calls"]

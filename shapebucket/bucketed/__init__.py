"""Bucketed models: any model's calls padded to a few planned shapes, outputs cut back.

``model.stats`` (a :class:`~shapebucket.bucketed.stats.BucketedReport`) says what the
wrapper padded; the record is returned, never built, so it is not exported here.

>>> import shapebucket.bucketed as sb
>>> sb.__all__
['BucketedModel']
"""

from .model import BucketedModel

__all__ = ["BucketedModel"]

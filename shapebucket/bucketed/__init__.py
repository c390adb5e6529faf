"""Bucketed models: any model's calls padded to a few planned shapes, outputs cut back.

>>> import shapebucket.bucketed as sb
>>> sb.__all__
['BucketedModel', 'BucketedStats']
"""

from .model import BucketedModel
from .stats import BucketedStats

__all__ = ["BucketedModel", "BucketedStats"]

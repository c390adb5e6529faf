"""The one exception type shapebucket raises for bad input or configuration."""

from __future__ import annotations

__all__ = ["ShapeBucketError"]


class ShapeBucketError(ValueError):
    """Bad input or configuration.

    Messages name the offending key, sample index and value, the limit it broke
    and how to fix it. It subclasses :class:`ValueError`, so code that already
    catches ``ValueError`` keeps working.

    >>> from shapebucket.fit import Buckets
    >>> try:
    ...     Buckets([8, 16]).bucket_for(20)
    ... except ShapeBucketError as e:
    ...     print(e)
    length 20 > largest bucket 16 in Buckets([8, 16]); add a bucket >= 20 or truncate the sample
    """

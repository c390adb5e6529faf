"""Built-in length distributions used by the demo, the benchmarks and the docs."""

from __future__ import annotations

import numpy as np

__all__ = ["mixture_lengths"]


def mixture_lengths(n: int, seed: int = 0) -> np.ndarray:
    """The project's reference mixture: ``L + 1`` with ``L`` drawn 90% uniform in
    [5, 31], 9% in [33, 63] and 1% in [65, 255] (so lengths span 6..256).

    >>> mixture_lengths(5, seed=0).shape
    (5,)
    """
    rng = np.random.default_rng(seed)
    part = rng.choice(3, size=n, p=[0.90, 0.09, 0.01])
    lo = np.array([5, 33, 65])[part]
    hi = np.array([31, 63, 255])[part]
    return (rng.integers(lo, hi + 1) + 1).astype(np.int64)

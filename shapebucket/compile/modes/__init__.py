"""Modes: small parts that change how :func:`~shapebucket.prewarm` makes its graphs (hooks in :mod:`.base`)."""

from .base import Job, Mode
from .cached import Cache
from .run import CudaGraphs, Inference, RecompileLimit, Repeat
from .specialize import Specialize, length_dims

__all__ = [
    "Cache",
    "CudaGraphs",
    "Inference",
    "Job",
    "Mode",
    "RecompileLimit",
    "Repeat",
    "Specialize",
    "length_dims",
]

"""Deprecated module path: the compile helpers now live in one module per job.

* :mod:`shapebucket.recompiles`: ``mark_dynamic``, ``CompileCounter``, ``no_recompiles``
* :mod:`shapebucket.warmup`: ``prewarm``, ``PrewarmReport``
* :mod:`shapebucket.state`: snapshot and restore of model and optimizer state
* :mod:`shapebucket.compile_cache`: ``save_compile_cache``, ``load_compile_cache``

Import them from ``shapebucket`` itself. ``shapebucket.compile`` keeps working for
one release and warns on import.
"""

from __future__ import annotations

import warnings

from .compile_cache import load_compile_cache, save_compile_cache
from .recompiles import CompileCounter, count_compiles, mark_dynamic, no_recompiles
from .warmup import PrewarmReport, prewarm

__all__ = [
    "CompileCounter",
    "PrewarmReport",
    "count_compiles",
    "load_compile_cache",
    "mark_dynamic",
    "no_recompiles",
    "prewarm",
    "save_compile_cache",
]

warnings.warn(
    "shapebucket.compile is deprecated; import these names from shapebucket "
    "(they live in shapebucket.recompiles, .warmup, .state and .compile_cache)",
    DeprecationWarning,
    stacklevel=2,
)

"""Compilation: prewarm every shape of a plan, guard against recompiles, keep the cache.

>>> import shapebucket.compile as sc
>>> "prewarm" in sc.__all__
True
"""

from .cache.aot import AotCache
from .cache.load import load_compile_cache
from .cache.save import save_compile_cache
from .marks import mark_dynamic
from .modes.base import Mode
from .modes.cached import Cache
from .modes.run import CudaGraphs, Inference, RecompileLimit, Repeat
from .prewarm import prewarm
from .recompiles import CompileCounter, check_recompile_limit, no_recompiles
from .regions import compile_regions

__all__ = [
    "AotCache",
    "Cache",
    "CompileCounter",
    "CudaGraphs",
    "Inference",
    "Mode",
    "RecompileLimit",
    "Repeat",
    "check_recompile_limit",
    "compile_regions",
    "load_compile_cache",
    "mark_dynamic",
    "no_recompiles",
    "prewarm",
    "save_compile_cache",
]

"""Compilation: prewarm every shape of a plan, guard against recompiles, keep the cache.

>>> import shapebucket.compile as sc
>>> "prewarm" in sc.__all__
True
"""

from .background import (
    BackgroundCompile,
    BackgroundOptions,
    BackgroundReport,
    compile_in_background,
)
from .cache.aot import AotCache
from .cache.artifacts import load_compile_cache, save_compile_cache
from .marks import mark_dynamic
from .modes import Cache, CudaGraphs, Inference, Mode, RecompileLimit, Repeat, Specialize
from .prewarm import prewarm
from .recompiles import CompileCounter, check_recompile_limit, no_recompiles
from .regions import compile_regions
from .report import PrewarmReport

__all__ = [
    "AotCache",
    "BackgroundCompile",
    "BackgroundOptions",
    "BackgroundReport",
    "Cache",
    "CompileCounter",
    "CudaGraphs",
    "Inference",
    "Mode",
    "PrewarmReport",
    "RecompileLimit",
    "Repeat",
    "Specialize",
    "check_recompile_limit",
    "compile_in_background",
    "compile_regions",
    "load_compile_cache",
    "mark_dynamic",
    "no_recompiles",
    "prewarm",
    "save_compile_cache",
]

"""Compile while training: train eagerly at once while a spawned process compiles each
shape of the plan; each shape switches to its compiled graph when its cache is
published (:func:`compile_in_background`).
"""

from .handle import BackgroundCompile, BackgroundOptions, compile_in_background
from .report import BackgroundReport

__all__ = ["BackgroundCompile", "BackgroundOptions", "BackgroundReport", "compile_in_background"]

"""Advising: estimates of a whole job from timings, and the choices they drive (the
number of buckets, buckets or packing, eager or compiled, fixed policies side by side)."""

from .kchoice import choose_k
from .policies import compare_policies
from .strategy import choose_strategy
from .timing import StepTiming, time_steps

__all__ = [
    "StepTiming",
    "choose_k",
    "choose_strategy",
    "compare_policies",
    "time_steps",
]

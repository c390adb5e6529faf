"""Advising: the number of buckets from the job (:func:`choose_k`) and fixed bucket
policies side by side (:func:`compare_policies`)."""

from .kchoice import choose_k
from .policies import compare_policies

__all__ = ["choose_k", "compare_policies"]

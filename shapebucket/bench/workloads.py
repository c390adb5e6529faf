"""Length distributions for the benchmark: the reference mixture, real text, captions, or a file."""

from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path

import numpy as np

from .._validate import check_int
from ..data import mixture_lengths, read_lengths

__all__ = [
    "WORKLOADS",
    "caption_lengths",
    "load_workload",
    "long_mixture_lengths",
    "stdlib_docstring_lengths",
    "stdlib_docstring_paragraphs",
]

WORKLOADS = ("mixture", "long-mixture", "text", "captioning")

_TOKEN = re.compile(r"\w+|[^\w\s]")


def stdlib_docstring_paragraphs() -> list[str]:
    """The paragraphs of the docstrings of the running interpreter's top-level stdlib
    modules (real English text, offline), split at blank lines, files sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paragraphs: list[str] = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    paragraphs.extend(p.strip() for p in re.split(r"\n\s*\n", doc) if p.strip())
    return paragraphs


def stdlib_docstring_lengths() -> np.ndarray:
    """Token counts (words and punctuation marks) of :func:`stdlib_docstring_paragraphs` of
    2 tokens or more: about 8,000 on CPython 3.11, median 14, longest about 600."""
    counts = (len(_TOKEN.findall(p)) for p in stdlib_docstring_paragraphs())
    return np.asarray([n for n in counts if n >= 2], dtype=np.int64)


def caption_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Caption lengths of the captioning workload: 90% uniform in [5, 31], 9% in [33, 63]
    and 1% in [65, 255] (the setting of the most-read guide on compiling variable-length
    training: a fixed-size image and a variable-length caption).

    >>> lengths = caption_lengths(1000)
    >>> int(lengths.min()) >= 5 and int(lengths.max()) <= 255
    True
    """
    return mixture_lengths(n, seed=seed) - 1  # the same draws: the mixture is L + 1


def long_mixture_lengths(n: int, *, max_len: int, seed: int = 0) -> np.ndarray:
    """Long-tailed sample lengths up to ``max_len``: 70% in ``[max_len/128, max_len/16]``,
    25% in ``(max_len/16, max_len/4]`` and 5% in ``(max_len/4, max_len]`` (at
    ``max_len=2048``: 16-128, 129-512 and 513-2,048 tokens).

    >>> lengths = long_mixture_lengths(1000, max_len=2048, seed=0)
    >>> int(lengths.min()) >= 16, int(lengths.max()) <= 2048
    (True, True)
    """
    check_int("max_len", max_len, minimum=128)
    rng = np.random.default_rng(seed)
    part = rng.choice(3, size=n, p=[0.70, 0.25, 0.05])
    lo = np.array([max_len // 128, max_len // 16 + 1, max_len // 4 + 1])[part]
    hi = np.array([max_len // 16, max_len // 4, max_len])[part]
    return rng.integers(lo, hi + 1).astype(np.int64)


def load_workload(
    name: str, *, n: int, max_len: int, seed: int, lengths_file: str | None = None
) -> tuple[np.ndarray, int]:
    """``(lengths, clipped)``: the workload's (or ``lengths_file``'s) lengths clipped to
    ``max_len`` and how many were; ``n`` is the samples drawn where a workload draws them."""
    if lengths_file is not None:
        lengths = read_lengths(lengths_file).astype(np.int64)
    elif name == "mixture":
        lengths = mixture_lengths(n, seed=seed)
    elif name == "long-mixture":
        lengths = long_mixture_lengths(n, max_len=max(max_len, 128), seed=seed)
    elif name == "text":
        lengths = stdlib_docstring_lengths()
    elif name == "captioning":
        lengths = caption_lengths(n, seed=seed)
    else:
        raise ValueError(f"unknown workload {name!r}")
    clipped = int((lengths > max_len).sum())
    return np.minimum(lengths, max_len), clipped

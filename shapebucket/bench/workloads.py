"""Length distributions for the benchmark: the reference mixture, real text, or a file."""

from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path

import numpy as np

from ..data import mixture_lengths

__all__ = ["load_workload", "stdlib_docstring_lengths"]

_TOKEN = re.compile(r"\w+|[^\w\s]")


def stdlib_docstring_lengths() -> np.ndarray:
    """Token counts of the paragraphs of the docstrings in Python's standard library.

    Real English technical text that every Python installation has offline: the
    module, class and function docstrings of the top-level ``*.py`` modules of
    the running interpreter's stdlib, split into paragraphs at blank lines and
    tokenized into words and punctuation marks (a rough stand-in for a subword
    tokenizer). Paragraphs of fewer than 2 tokens are skipped. About 8,000
    paragraphs on CPython 3.11, median 14 tokens, longest about 600.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    lengths: list[int] = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    for para in re.split(r"\n\s*\n", doc):
                        n = len(_TOKEN.findall(para))
                        if n >= 2:
                            lengths.append(n)
    return np.asarray(lengths, dtype=np.int64)


def load_workload(name: str, *, n: int, max_len: int, seed: int, lengths_file: str | None = None) -> tuple[np.ndarray, int]:
    """``(lengths, clipped)``: the workload's lengths, clipped to ``max_len``, and how many were clipped.

    ``mixture`` draws ``n`` samples; ``text`` and ``file`` use all their lengths.
    """
    if lengths_file is not None:
        from ..__main__ import read_lengths

        lengths = read_lengths(lengths_file).astype(np.int64)
    elif name == "mixture":
        lengths = mixture_lengths(n, seed=seed)
    elif name == "text":
        lengths = stdlib_docstring_lengths()
    else:
        raise ValueError(f"unknown workload {name!r}")
    clipped = int((lengths > max_len).sum())
    return np.minimum(lengths, max_len), clipped

"""The compiler's recompile messages, read: what the ``fail_on_recompile`` stance raises
and the guard failures it lists (torch 2.13 wording, which is not a public API: a torch
upgrade that changes it touches this module only)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GuardFailure", "is_recompile_error", "parse_recompile_error"]

_FAILURE_LINE = re.compile(r"- \d+/\d+: (.*)")
_SIZE_MISMATCH = re.compile(
    r"tensor '(.+?)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)"
)


@dataclass(frozen=True)
class GuardFailure:
    """One guard failure from a recompile message: a size mismatch (``name``, ``dim``,
    ``expected``, ``actual`` set) or another guard (only ``text``)."""

    text: str
    name: str | None = None
    dim: int | None = None
    expected: int | None = None
    actual: int | None = None

    @property
    def is_size(self) -> bool:
        return self.name is not None


def is_recompile_error(error: BaseException) -> bool:
    """Whether ``error`` is what the ``fail_on_recompile`` stance raises."""
    return isinstance(error, RuntimeError) and "fail_on_recompile" in str(error)


def parse_recompile_error(text: str) -> list[GuardFailure]:
    """The guard failures listed in a ``fail_on_recompile`` error (torch 2.13 wording); a
    name may hold quotes itself (``kwargs['input_ids']``, a Hugging Face model's input).

    >>> [f.name for f in parse_recompile_error(
    ...     "- 0/0: tensor 'kwargs['input_ids']' size mismatch at index 1. expected 8, actual 24")]
    ["kwargs['input_ids']"]
    """
    out = []
    for line in _FAILURE_LINE.findall(text):
        m = _SIZE_MISMATCH.search(line)
        if m:
            name, dim, expected, actual = m.groups()
            out.append(GuardFailure(line, name, int(dim), int(expected), int(actual)))
        else:
            out.append(GuardFailure(line.strip()))
    return out

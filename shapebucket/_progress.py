"""The one progress display for long work (prewarm, the benchmark): tqdm when installed,
else a plain line per item on stderr."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["progress"]

T = TypeVar("T")


class _Plain(Generic[T]):
    def __init__(self, items: Sequence[T], desc: str, shown: bool) -> None:
        self.items, self.desc, self.shown = items, desc, shown

    def __iter__(self) -> Iterator[T]:
        for i, item in enumerate(self.items, 1):
            if self.shown:
                print(f"{self.desc}: {item} ({i}/{len(self.items)})", file=sys.stderr, flush=True)
            yield item

    def set_postfix_str(self, text: str) -> None:
        pass


def progress(items: Sequence[T], *, desc: str, unit: str, enabled: bool = True) -> Any:
    """An iterable over ``items`` that shows progress, with ``set_postfix_str(text)``.

    >>> bar = progress([1, 2], desc="demo", unit="item", enabled=False)
    >>> bar.set_postfix_str("note"); list(bar)
    [1, 2]
    """
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # tqdm is optional (the bench and test extras have it)
            pass
        else:
            return tqdm(items, desc=desc, unit=unit, file=sys.stderr)
    return _Plain(items, desc, shown=enabled)

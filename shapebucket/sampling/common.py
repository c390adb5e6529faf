"""The small parts the samplers share: read-only settings, the world size and rank, and the
refusal of ``rows`` beside a token budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, NoReturn, TypeVar, overload

from .._validate import check_int
from ..errors import ShapeBucketError

__all__ = ["Setting", "refuse_rows", "resolve_world"]

T = TypeVar("T")


class Setting(Generic[T]):
    """A sampler setting: reads as an attribute (stored as ``_<name>``); assigning it (which
    would leave the batches stale) raises an ``AttributeError`` saying ``how`` to change it."""

    def __init__(self, doc: str, *, how: str | None = None) -> None:
        self.__doc__ = doc
        self._how = how
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> T | Setting[T]:
        if obj is None:
            return self
        value: T = obj.__dict__["_" + self.name]
        return value

    def __set__(self, obj: object, value: Any) -> NoReturn:
        kind = type(obj).__name__
        how = self._how or f"make a new {kind}(..., {self.name}=...)"
        raise AttributeError(f"{kind}.{self.name} is fixed once the sampler is built; {how}")


def _default_distributed() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, checked; what is not given comes from ``torch.distributed``
    when it is initialised, else 1 and 0.

    >>> resolve_world(4, 1)
    (4, 1)
    """
    if num_replicas is None or rank is None:
        world, own = _default_distributed()
        num_replicas = world if num_replicas is None else num_replicas
        rank = own if rank is None else rank
    num_replicas = check_int("num_replicas", num_replicas, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= num_replicas:
        raise ShapeBucketError(
            f"rank {rank} is not < num_replicas {num_replicas}; ranks count from 0"
        )
    return num_replicas, rank


def refuse_rows(options: Mapping[str, Any]) -> None:
    """Refuse ``rows`` among a ``for_tokens`` constructor's ``options`` (it computes them).

    >>> refuse_rows({"shuffle": False})
    """
    if "rows" in options:
        raise ShapeBucketError(
            f"for_tokens computes rows from tokens_per_batch, so rows={options['rows']!r} "
            "cannot be passed too; give tokens_per_batch (for_tokens) or rows (the "
            "constructor), not both"
        )

"""The ``Specialize`` mode: one dynamic trace with a kernel per planned length."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ... import _torch as compat
from ...errors import ShapeBucketError
from ...plan.contract import walk_batch
from ...plan.shapes import Shape, ShapePlan
from .base import Job, Mode

__all__ = ["Specialize", "length_dims"]


def length_dims(plan: ShapePlan, make: Callable[[Shape], Any]) -> dict[str, list[int]]:
    """Which dims of which leaves of a batch follow the length: ``{path: [dims]}``.

    Found by making batches at the plan's first two lengths (it needs two) and keeping the
    dims equal to each length (a ``[B, F, L]`` value, its ``[B, L]`` mask and a ``[B, L, L]``
    block mask alike).

    >>> plan = ShapePlan.from_function([(2, 8), (2, 16)], lambda s: {"x": torch.ones(s.rows, 3, s.length), "m": torch.ones(s.rows, s.length)})
    >>> length_dims(plan, lambda s: plan.batch(None, s))
    {'x': [2], 'm': [1]}
    """
    a, b = (next(s for s in plan if s.length == n) for n in list(plan.lengths)[:2])
    leaves_a, leaves_b = dict(walk_batch(make(a))), dict(walk_batch(make(b)))
    out: dict[str, list[int]] = {}
    for path, x in leaves_a.items():
        y = leaves_b.get(path)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.ndim == y.ndim:
            dims = [i for i in range(x.ndim) if x.shape[i] == a.length and y.shape[i] == b.length]
            if dims:
                out[path] = dims
    return out


@dataclass(frozen=True)
class Specialize(Mode):
    """One dynamic graph for every length, with a kernel specialised to each length.

    Every prewarm batch's length dims (of all its tensors: values, masks,
    positions; see :func:`length_dims`) are marked dynamic, the first with
    ``specialize_on`` one predicate per length of the plan, the others plainly
    (they share its size; torch builds no cross product). Torch traces once,
    compiles a kernel per length plus a generic one, so a length no bucket
    covers runs compiled code instead of recompiling. The training loop needs no
    marks; compile the model with ``dynamic=False`` or ``None``.

    Which dim takes the predicates matters to torch: it keeps one source of the
    equal sizes as the graph's input, and a specialisation on another source
    fails inside dynamo (``TensorPropertySource(...) is not in list``). Which one
    it keeps depends on the model (a ``[B, L]`` mask's for ``x * mask[:, None]``,
    a ``[B, F, L]`` value's behind ``transpose`` and ``Linear``), so the first
    shape tries a ``[B, L]`` dim first and, on that error, each other marked dim
    (:meth:`retry`; the failed tries' graphs count in that shape's
    ``report.graphs``). When none works, :class:`ShapeBucketError` says to
    prewarm without ``Specialize()``.
    """

    def setup(self, job: Job) -> None:
        if len(job.plan.lengths) < 2:
            raise ShapeBucketError(
                f"Specialize: the plan has one length ({list(job.plan.lengths)}), so there is "
                "nothing to share one dynamic trace between (and no second length to find the "
                "length dim by); prewarm it without Specialize()"
            )
        job.memo["length_dims"] = length_dims(job.plan, job.batch)
        if not job.memo["length_dims"]:
            raise ShapeBucketError(
                f"Specialize: no tensor of the plan's batches changes with the length "
                f"({list(job.plan.lengths)}); build the plan from the collator that made the "
                "example (ShapePlan.of(collator, sampler))"
            )

    def prepare(self, batch: Any, shape: Shape, job: Job) -> Any:
        dims = job.memo["length_dims"]
        marks = [
            (leaf, dim)
            for path, leaf in walk_batch(batch)
            if isinstance(leaf, torch.Tensor) and path in dims
            for dim in dims[path]
            if leaf.ndim > dim and leaf.shape[dim] == shape.length
        ]
        if not marks:
            raise ShapeBucketError(
                f"Specialize: no tensor of the batch for shape {tuple(shape)} has length "
                f"{shape.length} where the plan's batches keep it ({dims})"
            )
        # specialize_on goes on one dim only, the others share its size symbol. The compiler
        # keeps one symbol of the equal ones as the graph's input, and a [B, F, L] value's
        # loses to a [B, L] mask's (InternalTorchDynamoError otherwise), so a [B, L] first.
        order = sorted(range(len(marks)), key=lambda i: (marks[i][0].ndim, marks[i][1], i))
        job.memo["specialize_tries"] = len(order)
        first = order[job.memo.get("specialize_on", 0) % len(order)]
        for i, (leaf, dim) in enumerate(marks):
            if i == first:
                compat.mark_dynamic_specialized(leaf, dim, list(job.plan.lengths))
            else:
                compat.mark_dynamic_dim(leaf, dim, strict=True, min=None, max=None)
        return batch

    def finish(self, job: Job) -> None:
        job.report.how.update(dict.fromkeys(job.plan, "specialised"))

    def retry(self, error: BaseException, job: Job) -> bool:
        """On torch's ``is not in list`` error, put the predicates on the next marked dim."""
        if not compat.is_specialization_source_error(error):
            return False
        tried = job.memo.get("specialize_on", 0) + 1
        if tried >= job.memo.get("specialize_tries", 1):
            raise ShapeBucketError(
                f"Specialize: torch found none of the {tried} length dims it was given "
                "among the graph's inputs (a torch limit of specialize_on, raised as "
                f"{type(error).__name__}: {str(error).splitlines()[0][:160]}); prewarm this "
                "model without Specialize() (one static graph per length)"
            ) from error
        job.memo["specialize_on"] = tried
        return True

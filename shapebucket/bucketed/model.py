"""``BucketedModel``: any model, every call padded to the nearest planned shape and its
outputs cut back to the caller's.

One line before or after ``torch.compile``::

    model = shapebucket.BucketedModel(model, buckets=[64, 128, 256], row_buckets=[8, 16, 32])

Each call's sequence tensors are padded along their length to the smallest bucket
that holds it (and the rows to the smallest row bucket), by the collator's own
padding (``labels`` -100, masks 0, token ids their pad value); the model runs at
that shape; every output with a padded dim is cut back. A scalar loss over labels
that ignore -100 comes back as it is.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from .. import _torch as compat
from ..collate import BucketCollator
from ..errors import ShapeBucketError
from ..plan import Shape, ShapePlan
from .calls import MASK_KEYS, Call, Side, forward_of, is_encoder_decoder, read_call, takes
from .pad import config_pad_values, cut_outputs, open_pad_rows, repad, side_collator
from .stats import BucketedReport

__all__ = ["BucketedModel"]

_BATCH_NORMS = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.SyncBatchNorm,
)


class _Forward:
    """The wrapper's ``forward``: the wrapped model's signature (so a ``Trainer`` keeps the
    dataset columns the model takes), the wrapper's padding. Pickles and deep-copies with
    its owner."""

    def __init__(self, owner: BucketedModel) -> None:
        self.owner = owner

    @compat.skip_frame_only  # a compiled wrapper compiles the padded call only
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.owner.bucketed_call(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(forward_of(self.owner.model))


class BucketedModel(torch.nn.Module):
    """Wrap ``model`` so that every call runs at a planned shape and returns the caller's.

    Args:
        model: a module (compiled or not) called with keyword tensors
            (``model(input_ids=..., attention_mask=..., labels=...)``; positional
            arguments are bound to ``forward``'s parameter names).
        buckets: the lengths calls are padded up to (``fit_buckets(lengths)`` or a
            sorted list of ints).
        row_buckets: the batch sizes calls are padded up to; ``None`` leaves the
            rows as they come.
        sequence_keys: the keys padded along their length; by default every tensor
            with the call's rows at dim 0 and its length at dim 1.
        pad_values: pad value per key (default: the collator's: ``labels`` -100,
            masks 0, token ids ``config.pad_token_id`` when the model has one, else 0).
        padding_side: ``"right"`` or ``"left"`` (left needs a model that takes
            ``attention_mask``).
        overflow: a call longer than the largest bucket (or with more rows than the
            largest row bucket): ``"error"`` refuses it; ``"eager"`` runs it at its own
            shape with the compiler off (``torch.compiler.set_stance("force_eager")``:
            no graph compiled, no CUDA graph recorded for it), warns once and
            counts it in ``stats.eager_calls``.

    The wrapper adds the token mask when the call has none and the model takes one
    (a padded call without it would attend to the pads), and ``position_ids`` when
    padding left and the model takes them. It passes ``use_cache=False`` to a model
    that takes ``use_cache`` (a cache at the padded length cannot be given back) and
    refuses ``use_cache=True``. ``plan(example)`` is every shape it runs, for
    :func:`~shapebucket.prewarm` and :func:`~shapebucket.no_recompiles`.

    >>> model = BucketedModel(torch.nn.Embedding(10, 4), buckets=[8, 16], sequence_keys=["input"])
    >>> model(input=torch.ones(3, 5, dtype=torch.long)).shape
    torch.Size([3, 5, 4])
    >>> model.stats.shapes
    {(3, 8): 1}
    """

    def __init__(
        self,
        model: torch.nn.Module,
        buckets: Sequence[int],
        *,
        row_buckets: Sequence[int] | None = None,
        sequence_keys: Sequence[str] | None = None,
        pad_values: Mapping[str, Any] | None = None,
        padding_side: Literal["right", "left"] = "right",
        overflow: Literal["error", "eager"] = "error",
    ) -> None:
        super().__init__()
        _apply_compiler_marks()
        if not callable(model):
            raise ShapeBucketError(
                f"BucketedModel wraps a model (a module or function), got {type(model).__name__}"
            )
        if overflow not in ("error", "eager"):
            raise ShapeBucketError(f"overflow must be 'error' or 'eager', got {overflow!r}")
        if sequence_keys is not None and (
            isinstance(sequence_keys, (str, bytes))
            or not isinstance(sequence_keys, Sequence)
            or not sequence_keys
            or not all(isinstance(k, str) for k in sequence_keys)
        ):
            one = f"[{sequence_keys!r}]" if isinstance(sequence_keys, str) else "['input_ids']"
            raise ShapeBucketError(
                f"sequence_keys must be a non-empty list of the call's keyword names, got "
                f"{sequence_keys!r}; for one key write {one}"
            )
        if pad_values is not None and not isinstance(pad_values, Mapping):
            raise ShapeBucketError(
                f"pad_values must be a mapping key -> number, got {pad_values!r}; for example "
                "pad_values={'input_ids': 0}"
            )
        self.model = model
        self.overflow = overflow
        self.sequence_keys = None if sequence_keys is None else list(sequence_keys)
        self.stats = BucketedReport()
        self._enc_dec = is_encoder_decoder(model)
        self._pad_values = {**config_pad_values(model), **dict(pad_values or {})}
        self._collators = {
            side: self._collator(side, buckets, row_buckets, padding_side) for side in MASK_KEYS
        }
        if padding_side == "left" and not takes(model, "attention_mask"):
            raise ShapeBucketError(
                f"padding_side='left' and {type(model).__name__}.forward takes no "
                "attention_mask: its real tokens would attend to the pads before them and "
                "sit at shifted positions; pad right (exact for a causal model), or pass a "
                "model that takes the mask"
            )
        self.forward = _Forward(self)  # type: ignore[method-assign]

    def _collator(
        self,
        side: str,
        buckets: Sequence[int],
        row_buckets: Sequence[int] | None,
        padding_side: str,
    ) -> BucketCollator:
        return side_collator(
            buckets,
            row_buckets,
            pad_values=self._pad_values,
            padding_side=padding_side,
            mask_key=MASK_KEYS[side],
        )

    @property
    def buckets(self) -> Any:
        """The bucket table (the collator's ``Buckets``)."""
        return self._collators["source"].buckets

    @property
    def row_buckets(self) -> list[int] | None:
        """The row counts calls are padded up to (``None``: rows as they come)."""
        rb = self._collators["source"].row_buckets
        return None if rb is None else list(rb)

    @property
    def padding_side(self) -> str:
        return str(self._collators["source"].padding_side)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("model")
            if inner is None or name.startswith("__"):
                raise
            # the wrapped model's attributes (config, generation_config, main_input_name, ...)
            return getattr(inner, name)

    def __repr__(self) -> str:
        return (
            f"BucketedModel({type(self.model).__name__}, buckets={self.buckets!r}, "
            f"row_buckets={self.row_buckets}, padding_side={self.padding_side!r})"
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        _apply_compiler_marks()  # unpickled where none was built yet
        super().__setstate__(state)

    # -- a call ------------------------------------------------------------------------

    @compat.skip_frame_only
    def bucketed_call(self, *args: Any, **kwargs: Any) -> Any:
        """``model(*args, **kwargs)`` run at the planned shape, cut back (what ``forward``
        does). Not traced itself: ``torch.compile`` of the wrapper compiles ``model``'s
        call on the padded batch, one graph per planned shape."""
        batch, call = self.pad(*args, **kwargs)
        if call.planned:
            out = self.model(**batch)
        else:  # overflow="eager": never compiled, no CUDA graph recorded for its shape
            with torch.compiler.set_stance("force_eager"):
                out = self.model(**batch)
        return _cut_back(out, call)

    @compat.not_compiled
    def pad(self, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], Call]:
        """The call's keyword batch padded to its planned shape, and what was padded.

        Not compiled (``torch.compile`` of the wrapper compiles the model's call on the
        padded batch only, so one graph per planned shape).
        """
        kwargs = self._bind(args, kwargs)
        self._refuse_cache(kwargs)
        rows, sides = read_call(kwargs, self._enc_dec, self.sequence_keys)
        call = self._plan_call(rows, sides)
        if call is None:
            self.stats.count_eager(rows, sides, largest=self.buckets[-1])
            same = {k: Side(k, s.keys, s.length, s.length) for k, s in sides.items()}
            return kwargs, Call(rows, rows, same, planned=False)
        self._refuse_batch_norm(call)
        if call.left and "labels" in kwargs:
            raise ShapeBucketError(
                "BucketedModel(padding_side='left') got a call with labels: a left pad sits "
                "before each row's first token, and a model that shifts its labels (a Hugging "
                "Face causal LM) would predict that token's label from the pad, a loss term the "
                "unpadded call does not have; pad right for training (left is for inference)"
            )
        batch = self._add_inputs(kwargs, call)
        for name, side in call.sides.items():
            collator = self._collator_for(name, side.keys)
            batch = repad(collator, batch, side.bucket, call.padded_rows)
        open_pad_rows(batch, call, MASK_KEYS)
        self.stats.count(call)
        return batch, call

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if not args:
            return kwargs
        try:
            bound = inspect.signature(forward_of(self.model)).bind_partial(*args, **kwargs)
        except TypeError as e:
            raise ShapeBucketError(
                f"BucketedModel could not name the call's positional arguments by "
                f"{type(self.model).__name__}.forward's parameters ({e}); pass them by name"
            ) from None
        if any(
            p.kind is p.VAR_POSITIONAL
            for p in bound.signature.parameters.values()
            if p.name in bound.arguments
        ):
            raise ShapeBucketError(
                f"{type(self.model).__name__}.forward takes *args, so the call's positional "
                "values have no names to pad them by; pass them by keyword"
            )
        return dict(bound.arguments)

    def _refuse_cache(self, kwargs: dict[str, Any]) -> None:
        if kwargs.get("use_cache") is True:
            raise ShapeBucketError(
                "BucketedModel: use_cache=True would return a cache at the padded length, which "
                "the caller cannot continue from; call the unwrapped model to generate, or pass "
                "use_cache=False"
            )
        if "use_cache" not in kwargs and takes(self.model, "use_cache"):
            kwargs["use_cache"] = False

    def _plan_call(self, rows: int, sides: dict[str, Side]) -> Call | None:
        """The padded shape of the call; ``None`` when it overflows and runs eagerly."""
        table = self.buckets
        too_long = [s for s in sides.values() if s.length > table[-1]]
        row_buckets = self.row_buckets or []
        if rows == 0 and not row_buckets:
            _refuse_empty(sides)
        too_many = bool(row_buckets) and rows > row_buckets[-1]
        if too_long or too_many:
            if self.overflow == "eager":
                return None
            if too_long:
                s = too_long[0]
                raise ShapeBucketError(
                    f"BucketedModel: {s.keys[0]!r} has length {s.length} > largest bucket "
                    f"{table[-1]} (buckets {list(table)}); add a bucket >= {s.length}, cut the "
                    "input, or pass overflow='eager' to run such calls eagerly at their own shape"
                )
            raise ShapeBucketError(
                f"BucketedModel: the call has {rows} rows > largest row bucket "
                f"{row_buckets[-1]} (row_buckets {row_buckets}); add a row bucket >= {rows}, "
                "split the batch, or pass overflow='eager'"
            )
        padded_rows = rows
        if row_buckets:
            padded_rows = next(r for r in row_buckets if r >= rows)
        for s in sides.values():
            s.bucket = next(b for b in table if b >= s.length)
        return Call(rows, padded_rows, sides, left=self.padding_side == "left")

    def _refuse_batch_norm(self, call: Call) -> None:
        if not (call.pads and self.training):
            return
        modules = self.model.modules() if isinstance(self.model, torch.nn.Module) else ()
        norms = [type(m).__name__ for m in modules if isinstance(m, _BATCH_NORMS)]
        if norms:
            raise ShapeBucketError(
                f"BucketedModel: the model has {norms[0]} and is training, so padding this "
                f"call ({call.rows} rows, lengths {[s.length for s in call.sides.values()]}) "
                "to its bucket would put the pads into the batch statistics; train it without "
                "the wrapper, use LayerNorm, or pad in the collator with exact-size batches"
            )

    def _add_inputs(self, kwargs: dict[str, Any], call: Call) -> dict[str, Any]:
        """The token mask (and, padding left, ``position_ids``) of a call that has none and
        a model that takes them: added to every call, padded or not, so that every call of
        a shape has the same inputs (one graph)."""
        batch = dict(kwargs)
        for name, side in call.sides.items():
            mask = MASK_KEYS[name]
            if mask in batch or not takes(self.model, mask):
                continue
            lead = kwargs[side.keys[0]]
            size = (lead.shape[0], side.length)
            batch[mask] = torch.ones(size, dtype=torch.long, device=lead.device)
            side.keys.append(mask)
        source = call.sides.get("source")
        wants_positions = call.left and takes(self.model, "position_ids")
        if wants_positions and source is not None and "position_ids" not in batch:
            lead = kwargs[source.keys[0]]
            positions = torch.arange(source.length, device=lead.device)
            batch["position_ids"] = positions.expand(lead.shape[0], -1)
            source.keys.append("position_ids")
        return batch

    def _collator_for(self, side: str, keys: list[str]) -> BucketCollator:
        base = self._collators[side]
        if base.sequence_keys == keys:
            return base
        collator = self._collators[side] = side_collator(
            base.buckets,
            base.row_buckets,
            pad_values=self._pad_values,
            padding_side=base.padding_side,
            mask_key=base.mask_key,
            sequence_keys=list(keys),
        )
        return collator

    # -- the plan ----------------------------------------------------------------------

    def plan(self, example: Mapping[str, Any]) -> ShapePlan:
        """Every shape this wrapper runs, each made from ``example`` (a call's keyword
        batch) re-padded to it: for :func:`~shapebucket.prewarm` and
        :func:`~shapebucket.no_recompiles`. Without ``row_buckets``, the example's rows.

        >>> model = BucketedModel(torch.nn.Embedding(10, 4), buckets=[8, 16], sequence_keys=["input"])
        >>> model.plan({"input": torch.ones(2, 3, dtype=torch.long)}).shapes
        (Shape(rows=2, length=8), Shape(rows=2, length=16))
        """
        if not isinstance(example, Mapping):
            raise ShapeBucketError(
                f"plan(example) takes the keyword batch of one call (a dict), got "
                f"{type(example).__name__}"
            )
        rows, sides = read_call(example, self._enc_dec, self.sequence_keys)
        if rows == 0:
            _refuse_empty(sides, "plan(example)")
        row_counts = self.row_buckets or [rows]
        table = list(self.buckets)
        if "target" in sides and "source" in sides:
            shapes: Any = [(r, s, t) for r in row_counts for s in table for t in table]
        else:
            shapes = [(r, b) for r in row_counts for b in table]
        example = dict(example)
        return ShapePlan.from_function(shapes, lambda shape: self._example_at(example, shape))

    def _example_at(self, example: dict[str, Any], shape: Shape) -> dict[str, Any]:
        kwargs = dict(example)
        rows, sides = read_call(kwargs, self._enc_dec, self.sequence_keys)
        call = Call(min(rows, shape.rows), shape.rows, sides, left=self.padding_side == "left")
        batch = self._add_inputs(kwargs, call)
        lengths = {"source": shape[1], "target": shape[-1]}
        for name, side in sides.items():
            # a longer example is cut to the shape (repad keeps its first tokens)
            batch = repad(self._collator_for(name, side.keys), batch, lengths[name], shape.rows)
        open_pad_rows(batch, call, MASK_KEYS)
        return batch


@compat.not_compiled
def _cut_back(out: Any, call: Call) -> Any:
    """``cut_outputs``, not compiled (so a compiled wrapper has no graph per call shape)."""
    return cut_outputs(out, call)


def _apply_compiler_marks() -> None:
    """The compiler marks of this module, at the first wrapper (``import`` loads no dynamo)."""
    compat.apply_compiler_marks(_Forward, BucketedModel, sys.modules[__name__])


def _refuse_empty(sides: dict[str, Side], what: str = "the call") -> None:
    keys = [s.keys[0] for s in sides.values()]
    raise ShapeBucketError(
        f"BucketedModel: {what} has 0 rows ({keys[0]!r}), so there is no planned shape to "
        "run it at (a shape of 0 rows would compile a graph of its own); skip empty batches, "
        "or pass row_buckets=[...] to pad them to the smallest row bucket"
    )

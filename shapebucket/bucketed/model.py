"""``BucketedModel``: any model, every call padded to the nearest planned shape and its
outputs cut back to the caller's (``docs/bucketed.md``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from .. import _torch as compat
from .._validate import check_flag, check_row_buckets
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets
from ..fit.step_cost import StepCost
from ..plan import ShapePlan
from . import tracing
from .calls import (
    Call,
    Route,
    Side,
    bind,
    parameters,
    read_call,
    route_of,
    signature_of,
    takes,
)
from .checks import (
    Packing,
    batch_norms,
    check_call,
    check_costs,
    check_pad_values,
    check_sequence_keys,
    check_settings,
    packing_of,
)
from .graphs import Graphs
from .outputs import cut_outputs
from .packed import pack
from .pad import config_pad_values, pad_call
from .planning import learn, plan_call, plan_of
from .stats import BucketedReport

__all__ = ["BucketedModel"]


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
        sequence_keys: the keys padded along their length; by default the keys the
            name rule of :mod:`shapebucket.bucketed.calls` names (``input_ids``,
            ``attention_mask``, token ``labels``, the ``decoder_*`` keys, ...).
        pad_values: pad value per key (default: ``labels`` -100, masks 0, torch's
            True-means-pad masks True, token ids ``config.pad_token_id`` when the model
            has one, else 0).
        padding_side: ``"right"`` or ``"left"`` (left needs a model that takes
            ``attention_mask`` and ``position_ids``).
        overflow: a call longer than the largest bucket (or with more rows than the
            largest row bucket): ``"error"`` refuses it; ``"eager"`` runs it at its own
            shape with the compiler off (``torch.compiler.set_stance("force_eager")``:
            no graph compiled, no CUDA graph recorded for it), warns once and
            counts it in ``stats.eager_calls``; ``"dynamic"`` runs it at its own shape on
            one dynamic graph (``torch.compile(dynamic=True)`` of the wrapped module,
            compiled at the first such call), warns once and counts it in
            ``stats.dynamic_calls``.
        costs: ``(static, dynamic)``, the measured :class:`~shapebucket.fit.StepCost` of
            this model's calls on planned (static) graphs and on a dynamic graph
            (``StepCost.from_steps({(rows, length): seconds})``); with
            ``overflow="dynamic"``, a call whose padded shape costs more than its own
            shape would on the dynamic graph runs there. The cut-off comes from the
            measured costs, not a constant.
        packing: pack each call's samples (its pads dropped) into a few rows of the
            bucket that holds its longest sample, instead of padding them: ``None``
            (default) when the model takes packed input (a Hugging Face decoder that
            reads samples from ``position_ids``, or a ``forward`` that takes
            ``document_ids``: :func:`~shapebucket.bucketed.packed.packs`) and
            ``row_buckets`` are given; ``True`` insists (refused when it cannot);
            ``False`` pads. Per-token outputs come back in the caller's layout, pad
            positions 0; a call whose mask is not right-padded is padded instead.
        graphs: run each planned call made with grad disabled (``torch.no_grad()``,
            ``torch.inference_mode()``: serving and evaluation loops) by replaying a CUDA
            graph the wrapper captured at the first call of its padded shape
            (:mod:`.graphs`): the call is copied into that shape's persistent static
            buffers, the graph replays, the outputs are cut back and cloned (a kept output
            is never overwritten by a later replay). One memory pool for all of them;
            counted in ``stats.graph_replays`` and ``stats.graphs_captured``. Calls with
            grad enabled run as without it (capturing autograd is what
            ``torch.compile(mode="reduce-overhead")`` does). Compile the model inside with
            the default mode (``reduce-overhead`` records graphs of its own); a compiled
            wrapper (``torch.compile(BucketedModel(...))``) and inputs not on CUDA are
            refused.

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
        overflow: Literal["error", "eager", "dynamic"] = "error",
        packing: bool | None = None,
        costs: tuple[StepCost, StepCost] | None = None,
        graphs: bool = False,
    ) -> None:
        super().__init__()
        tracing.apply_marks(BucketedModel)
        self._params = dict(parameters(model))
        check_settings(model, overflow, padding_side, self._params)
        self.model = model
        self.overflow = overflow
        self.sequence_keys = check_sequence_keys(sequence_keys)
        self.stats = BucketedReport()
        self._table = Buckets(buckets)
        self._rows = None if row_buckets is None else check_row_buckets(row_buckets)
        self._left = padding_side == "left"
        config = getattr(model, "config", None)
        self._enc_dec = getattr(config, "is_encoder_decoder", False) is True
        # a Hugging Face single-label classifier: cross-entropy over labels ignores -100
        self._class_labels = getattr(config, "num_labels", 0) > 1 and getattr(
            config, "problem_type", None
        ) in (None, "single_label_classification")
        self._pad_values = {**config_pad_values(model), **check_pad_values(pad_values)}
        self._routes: dict[tuple[Any, ...], Route] = {}
        self._norms = batch_norms(model)
        self._packing = packing_of(model, packing, self._rows, self._params)
        self._costs = check_costs(costs, self.overflow)
        self._dynamic = tracing.DynamicGraph()  # compiled at the first call past the plan
        self._graphs = Graphs() if check_flag("graphs", graphs) else None
        self.forward = tracing.Forward(self)  # type: ignore[method-assign]

    @property
    def buckets(self) -> Buckets:
        """The bucket table."""
        return self._table

    @property
    def row_buckets(self) -> list[int] | None:
        """The row counts calls are padded up to (``None``: rows as they come)."""
        return None if self._rows is None else list(self._rows)

    @property
    def packing(self) -> Packing | None:
        """How calls are packed (``None``: padded)."""
        return self._packing

    @property
    def padding_side(self) -> str:
        return "left" if self._left else "right"

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
        tracing.apply_marks(BucketedModel)  # unpickled where none was built yet
        super().__setstate__(state)

    # -- a call ------------------------------------------------------------------------

    @compat.skip_frame_only
    def bucketed_call(self, *args: Any, **kwargs: Any) -> Any:
        """``model(*args, **kwargs)`` run at the planned shape, cut back (what ``forward``
        does). Not traced itself: ``torch.compile`` of the wrapper compiles ``model``'s
        call on the padded batch, one graph per planned shape."""
        compiled = tracing.in_compiled_call()  # the wrapper is compiled
        if compiled and self._graphs is not None:
            raise ShapeBucketError(
                "BucketedModel(graphs=True) is compiled itself (torch.compile(BucketedModel("
                "...))), so its graphs would be captured inside a compiled frame; compile the "
                "model inside it instead: BucketedModel(torch.compile(model), graphs=True)"
            )
        batch, call = self.pad(*args, **kwargs) if compiled else self._pad(args, kwargs)
        if not call.planned:
            if self.overflow == "dynamic":  # one dynamic graph, compiled at its first call
                return self._dynamic(self.model, batch)
            return tracing.uncompiled(self.model, batch)  # no graph, no CUDA graph recorded
        if self._graphs is not None and not torch.is_grad_enabled():
            return self._graphs.run(self.model, batch, call, self.stats)
        out = self.model(**batch)
        return tracing.cut_back(out, call) if compiled else cut_outputs(out, call.outputs, call)

    @compat.not_compiled
    def pad(self, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], Call]:
        """The call's keyword batch padded to its planned shape, and what was padded.

        Not compiled (``torch.compile`` of the wrapper compiles the model's call on the
        padded batch only, so one graph per planned shape).
        """
        return self._pad(args, kwargs)

    def _pad(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], Call]:
        if args:
            kwargs = bind(self._params, args, kwargs, self.model)
        route = self.route(kwargs)
        rows, sides = read_call(kwargs, route)
        # a call that may pack has its rows checked once packed (they may be fewer)
        may_pack = self._packing is not None and (route.outputs is None or route.packer is not None)
        call = self._plan_call(rows, sides, packed=may_pack)
        if isinstance(call, str):  # why it runs at its own shape
            return self._unplanned(kwargs, rows, sides, call)
        check_call(call, route, kwargs, self._norms, getattr(self.model, "training", False))
        if route.outputs is None and (call.pads or self._packing is not None):
            learn(self, kwargs, route, sides)
        call.outputs = route.outputs
        packed = pack(self, kwargs, route, call) if route.packer is not None else None
        if isinstance(packed, str):  # its samples pack into more rows than planned
            return self._unplanned(kwargs, rows, sides, packed)
        if packed is None and call.padded_rows not in (self._rows or (call.padded_rows,)):
            outputs = call.outputs  # a packed plan's call padded instead: rows checked now
            call = self._plan_call(rows, sides, packed=False)
            if isinstance(call, str):
                return self._unplanned(kwargs, rows, sides, call)
            call.outputs = outputs
        batch, call = packed or (self.with_cache_off(pad_call(kwargs, route, call)), call)
        self.stats.count(call)
        return batch, call

    def _plan_call(self, rows: int, sides: dict[str, Side], packed: bool) -> Call | str:
        return plan_call(
            rows,
            sides,
            lengths=self._table.lengths,
            row_buckets=self._rows,
            overflow=self.overflow,
            costs=self._costs,
            left=self._left,
            packed=packed,
        )

    def _unplanned(
        self, kwargs: dict[str, Any], rows: int, sides: dict[str, Side], why: str
    ) -> tuple[dict[str, Any], Call]:
        """The call as it came, to run at its own shape (counted, warned once)."""
        self.stats.count_unplanned(rows, sides, why, self.overflow)
        same = {k: Side(s.keys, s.length, s.length) for k, s in sides.items()}
        return self.with_cache_off(kwargs), Call(rows, rows, same, planned=False)

    def route(self, kwargs: Mapping[str, Any]) -> Route:
        """How calls like ``kwargs`` are padded (read once per kind of call)."""
        key = signature_of(kwargs)
        route = self._routes.get(key)
        if route is None:
            if kwargs.get("use_cache") is True:
                raise ShapeBucketError(
                    "BucketedModel: use_cache=True would return a cache at the padded length, "
                    "which the caller cannot continue from; call the unwrapped model to "
                    "generate, or pass use_cache=False"
                )
            route = self._routes[key] = route_of(
                kwargs,
                enc_dec=self._enc_dec,
                sequence_keys=self.sequence_keys,
                params=self._params,
                pad_values=self._pad_values,
                left=self._left,
                class_labels=self._class_labels,
            )
        return route

    def with_cache_off(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``use_cache=False`` for a model that takes it (a cache at the padded length cannot
        be given back)."""
        if "use_cache" not in batch and takes(self._params, "use_cache"):
            batch["use_cache"] = False
        return batch

    def plan(self, example: Mapping[str, Any]) -> ShapePlan:
        """Every shape this wrapper runs, each made from ``example`` (a call's keyword
        batch) re-padded to it: for :func:`~shapebucket.prewarm` and
        :func:`~shapebucket.no_recompiles`. Without ``row_buckets``, the example's rows.

        >>> model = BucketedModel(torch.nn.Embedding(10, 4), buckets=[8, 16], sequence_keys=["input"])
        >>> model.plan({"input": torch.ones(2, 3, dtype=torch.long)}).shapes
        (Shape(rows=2, length=8), Shape(rows=2, length=16))
        """
        return plan_of(self, example)

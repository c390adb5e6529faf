"""CUDA graphs of a wrapper's planned calls, replayed over persistent static input buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .. import _torch as compat
from ..errors import ShapeBucketError
from .calls import Call
from .outputs import cloned, cut_outputs, leaves, numbers
from .stats import BucketedReport

__all__ = ["Graphs", "capture", "emulated_capture"]

#: runs of the model on the static buffers before its capture, on a side stream: the
#: first compiles a compiled model, the next finds its lazy set-up done
WARMUP_RUNS = 2
#: the values besides tensors a graphed call may take (a graph bakes them in: they are
#: part of its key, compared by value)
PLAIN = (type(None), bool, int, float, str)


def capture(
    fn: Callable[[dict[str, Any]], Any], static: dict[str, Any], pool: Graphs
) -> tuple[Callable[[], None], Any]:
    """Capture ``fn(static)`` as one ``torch.cuda.CUDAGraph`` in ``pool.handle`` (shared by
    a wrapper's graphs): ``(replay, static_out)``; ``replay()`` reruns it on what
    ``static`` holds then and writes ``static_out`` in place."""
    for key, v in static.items():
        if isinstance(v, torch.Tensor) and v.device.type != "cuda":
            raise ShapeBucketError(
                f"BucketedModel(graphs=True): {key!r} (shape {tuple(v.shape)}) is on "
                f"{v.device}, and a CUDA graph captures CUDA work only; move the model and "
                "its inputs to CUDA, or pass graphs=False"
            )
    if pool.handle is None:
        pool.handle = torch.cuda.graph_pool_handle()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            fn(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool.handle), _uncached_autocast():
        static_out = fn(static)
    return graph.replay, static_out


def _uncached_autocast() -> Any:
    """The caller's CUDA autocast with its weight-cast cache off, for a capture (torch's
    CUDA-graph notes: a cached cast freed when the caller's ``autocast`` block exits would
    leave the graph reading freed memory); nothing when autocast is off."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    dtype = torch.get_autocast_dtype("cuda")
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)


def emulated_capture(
    fn: Callable[[dict[str, Any]], Any], static: dict[str, Any], pool: Any
) -> tuple[Callable[[], None], Any]:
    """A stand-in for :func:`capture` where there is no CUDA graph (a CPU), for tests and
    the host-time benchmark (``monkeypatch.setattr(graphs, "capture", emulated_capture)``):
    ``replay()`` runs ``fn`` again on what ``static`` holds and copies the result into
    ``static_out`` in place, as a graph replay writes its outputs. Never the default:
    it saves no host work.

    >>> static = {"x": torch.ones(2)}
    >>> replay, out = emulated_capture(lambda b: b["x"] * 2, static, None)
    >>> _ = static["x"].fill_(3.0)
    >>> replay()
    >>> out.tolist()
    [6.0, 6.0]
    """
    static_out = fn(static)

    def replay() -> None:
        new = fn(static)
        with torch.inference_mode():  # outputs made in inference mode take writes there only
            for (_, s), (_, t) in zip(leaves(static_out), leaves(new), strict=True):
                s.copy_(t)

    return replay, static_out


@dataclass
class Graph:
    """One captured graph: its replay, its static input tensors (each call is copied into
    them) by key, and its static outputs (replays write them)."""

    replay: Callable[[], None]
    names: tuple[str, ...]
    inputs: list[torch.Tensor]
    out: Any


def key_of(batch: Mapping[str, Any]) -> tuple[Any, ...]:
    """A padded batch's graph key: its keys in order, each tensor's shape, dtype and
    device, every other value with its type (so a route's keys and every shape count).
    A float is keyed by its bits (``float.hex``): ``1 == True == 1.0`` and ``0.0 ==
    -0.0`` in Python, but a model may tell them apart, and a NaN is never equal to
    itself (each call would capture a graph of its own).

    >>> key_of({"a": 1}) == key_of({"a": True}), key_of({"a": 0.0}) == key_of({"a": -0.0})
    (False, False)
    """
    return tuple(
        (k, v.shape, v.dtype, v.device)
        if isinstance(v, torch.Tensor)
        else (k, type(v), v.hex() if isinstance(v, float) else v)
        for k, v in batch.items()
    )


def state_of(model: Any, batch: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a graph bakes in besides its batch: the model's mode (``train()`` or
    ``eval()``: dropout on or off) and autocast on the batch's device (on or off, and
    its dtype: the dtypes of every op).

    >>> state_of(torch.nn.Linear(1, 1).eval(), {"x": torch.ones(1)})
    (False, False, torch.bfloat16)
    """
    device = next((v.device.type for v in batch.values() if isinstance(v, torch.Tensor)), "cpu")
    training = bool(compat.unwrap_compiled(model).training)
    if not torch.amp.is_autocast_available(device):  # "meta": refused by the capture
        return (training, False, None)
    return (training, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))


def _refuse_values(batch: Mapping[str, Any]) -> None:
    for k, v in batch.items():
        if not isinstance(v, (torch.Tensor, *PLAIN)):
            raise ShapeBucketError(
                f"BucketedModel(graphs=True): {k!r} is a {type(v).__name__}, not a tensor or "
                "a plain value (None, bool, int, float, str); a CUDA graph would bake it in "
                "and replay it for every later call; pass its tensors by keyword, or "
                "graphs=False"
            )


class Graphs:
    """A wrapper's captured graphs, one per padded batch key and state (the model's
    mode, autocast: :func:`state_of`), sharing one memory pool.
    Nothing of it pickles or deep-copies (captured graphs belong to their process): a
    copy starts with none."""

    def __init__(self) -> None:
        self.table: dict[Hashable, Graph] = {}
        self.handle: Any = None  # torch.cuda.graph_pool_handle(), as vLLM shares one

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def run(self, model: Any, batch: dict[str, Any], call: Call, stats: BucketedReport) -> Any:
        """``model(**batch)`` by a replay of its key's graph (captured at its first call),
        cut back to ``call``, every tensor cloned (the next replay overwrites them)."""
        key = (state_of(model, batch), key_of(batch))
        try:
            graph = self.table.get(key)
        except TypeError:  # an unhashable value
            _refuse_values(batch)
            raise
        if graph is None:
            _refuse_values(batch)
            graph = self.table[key] = self._capture(model, batch)
            stats.graphs_captured += 1
        # also after a capture: its warm-up runs may have written into the static
        # inputs (a model that writes into its inputs in place)
        compat.copy_all(graph.inputs, [batch[k] for k in graph.names])
        graph.replay()
        stats.graph_replays += 1
        return cloned(cut_outputs(graph.out, call.outputs, call))

    def _capture(self, model: Any, batch: dict[str, Any]) -> Graph:
        # the static buffers are made outside inference mode: later calls under no_grad
        # copy into them too (an inference tensor takes no in-place write outside it)
        with torch.inference_mode(False), torch.no_grad():
            static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        names = tuple(k for k, v in static.items() if isinstance(v, torch.Tensor))
        shapes = {k: tuple(static[k].shape) for k in names}
        try:
            replay, out = capture(lambda b: model(**b), static, self)
        except ShapeBucketError:
            raise
        except Exception as e:
            raise ShapeBucketError(
                f"BucketedModel(graphs=True): capturing the CUDA graph of the call {shapes} "
                f"failed: {type(e).__name__}: {e}. A captured forward may not wait for the "
                "host (.item(), .tolist(), .cpu(), a Python branch or shape that reads a "
                "tensor's values); take those out of the model's forward, or pass graphs=False"
            ) from e
        for path, v in numbers(out):
            raise ShapeBucketError(
                f"BucketedModel(graphs=True): {path} is the {type(v).__name__} {v!r}, worked "
                f"out in Python when the graph of the call {shapes} was captured; a replay "
                f"runs the graph's kernels only and would give back {v!r} for every later "
                "call of that shape; return it as a tensor, or pass graphs=False"
            )
        return Graph(replay, names, [static[k] for k in names], out)

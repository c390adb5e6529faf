"""One batch through the model or the step (:func:`run_batch`, for prewarm and
``calibrate_rows``), and the checks before a first run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import _torch as compat
from ..errors import ShapeBucketError
from ..plan.contract import walk_batch

__all__ = [
    "backward_outputs",
    "check_callables",
    "refuse_cached_decoder",
    "run_batch",
]


def run_batch(
    model: Any, step: Callable[[Any], Any] | None, batch: Any, who: str = "prewarm"
) -> None:
    """``step(batch)``, or ``model(**batch)`` / ``model(*batch)`` / ``model(batch)`` and
    a backward through the output (:func:`backward_outputs`), so that the backward graphs
    compile too. ``who`` (prewarm, calibrate_rows, ...) names the caller in its errors."""
    if step is not None:
        step(batch)
        return
    if isinstance(batch, Mapping):
        out = _call_with_keys(model, batch, who)
    elif isinstance(batch, (list, tuple)):
        out = model(*batch)
    else:
        out = model(batch)
    backward_outputs(out)


def backward_outputs(out: Any) -> None:
    """Run backward through a model's output: ``loss.backward()`` on a scalar loss (the
    output itself, ``out["loss"]`` or ``out.loss``) that requires grad, else a backward
    from every tensor in the output that requires grad (in dicts, ``ModelOutput``s,
    tuples, lists and dataclasses), each with a gradient of ones (``out.sum().backward()``
    for each). AOT autograd compiles one backward graph per forward graph, whatever
    gradient reaches it, so this compiles the one the training loop's loss will use.
    Nothing requires grad (``torch.no_grad()``, ``inference_mode``, frozen weights): no
    backward. The ``.grad``s it makes are the caller's to put back (prewarm restores them).

    >>> w = torch.ones(2, requires_grad=True)
    >>> backward_outputs({"logits": w * 3, "ids": torch.arange(2)})
    >>> w.grad
    tensor([3., 3.])
    """
    loss = out
    if isinstance(out, Mapping) and "loss" in out:
        loss = out["loss"]
    elif hasattr(out, "loss"):
        loss = out.loss
    if isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.requires_grad:
        loss.backward()
        return
    found = {id(v): v for _, v in walk_batch(out) if isinstance(v, torch.Tensor)}  # each once
    tensors = [t for t in found.values() if t.requires_grad]
    if tensors:
        torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])


def _call_with_keys(model: Any, batch: Mapping[str, Any], who: str) -> Any:
    """``model(**batch)``, or a :class:`ShapeBucketError` naming the key it does not take."""
    try:
        return model(**batch)
    except TypeError as error:
        if "unexpected keyword argument" not in str(error):
            raise
        raise ShapeBucketError(
            f"{who} called model(**batch) with the batch's keys {sorted(batch)} and the model "
            f"refused one: {error}. Let forward take it (a packed batch's position_ids and "
            "document_ids say where each sample starts: a model that ignores them attends across "
            "samples), have the collator leave it out (PackedCollator(position_key=None) / "
            "document_key=None, BucketCollator(mask_key=None)), or pass step= to call the model "
            "your own way"
        ) from error


def refuse_cached_decoder(model: Any, who: str) -> None:
    """Refuse a Hugging Face decoder that keeps a cache, for packed batches: the one
    ``use_cache`` check of prewarm and the Trainers.

    transformers finds packed samples from ``position_ids`` only when the model has no
    cache, and a decoder whose config says ``use_cache=True`` (Llama's default) makes
    one on every forward, in training too: every sample then attends to the samples
    before it in its row. ``who`` names the caller in the error.

    >>> refuse_cached_decoder(torch.nn.Linear(2, 2), "prewarm")  # no config: nothing to refuse
    """
    module = compat.unwrap_compiled(model)
    config = getattr(module, "config", None)
    if getattr(config, "use_cache", False) is True:
        raise ShapeBucketError(
            f"{who}: packed batches and {type(module).__name__} with config.use_cache=True: a "
            "Hugging Face decoder ignores packed position_ids while it keeps a cache, so every "
            "sample would attend to the ones before it in its row; set "
            "model.config.use_cache = False before training (a Trainer: pass "
            "TrainingArguments(use_cache=False), the default, which it copies into model.config)"
        )


def check_callables(model: Any, step: Any, who: str) -> None:
    """A step that is not a function, or (without a step) no model or a model that cannot
    be called, is refused before anything is snapshotted or run; ``who`` (prewarm,
    calibrate_rows) names the caller in the error.

    >>> check_callables(torch.nn.Linear(2, 2), None, "prewarm")  # callable: nothing to refuse
    """
    if step is not None and not callable(step):
        raise ShapeBucketError(
            f"{who}: step must be a function batch -> None (a whole training step), got "
            f"{step!r:.80}; pass step=None to run model(**batch) and backward()"
        )
    if step is None and model is None:
        raise ShapeBucketError(f"{who} needs a model or a step function; pass step=")
    if step is None and not callable(model):
        raise ShapeBucketError(
            f"{who} runs model(**batch) without a step, but model is a "
            f"{type(model).__name__} ({model!r:.60}), which cannot be called; pass the "
            "torch.compile'd module, or step=a function that runs one batch"
        )

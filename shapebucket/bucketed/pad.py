"""Padding a call up to its planned shape, and cutting the outputs back.

The padding itself is the collator's: a :class:`~shapebucket.BucketCollator` per side
re-pads the call (``labels`` with -100, the token mask with 0, every other key with
its pad value), through :func:`repad`, the one place this package calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..collate import BucketCollator
from ..plan import Shape
from .calls import Call

__all__ = [
    "ID_KEYS",
    "config_pad_values",
    "cut_outputs",
    "open_pad_rows",
    "repad",
    "side_collator",
]

#: the keys that hold token ids, padded with the model config's ``pad_token_id``
ID_KEYS = ("input_ids", "decoder_input_ids")


def repad(collator: BucketCollator, batch: dict[str, Any], bucket: int, rows: int) -> Any:
    """``batch`` padded by ``collator`` to ``bucket`` with ``rows`` rows."""
    return collator.repad(batch, Shape(rows, bucket))


def open_pad_rows(batch: dict[str, Any], call: Call, masks: Mapping[str, str]) -> None:
    """Give each all-pad row one unmasked token (its first; padding left, its last), in
    place. A row whose mask is all 0 leaves every attention query of it with no key: an
    attention that fills masked scores with -inf gives NaN (torch's SDPA gives 0), and its
    backward NaN gradients, although the row's labels are all -100. The row's outputs are
    cut off and carry no loss, so no real row sees the change.

    >>> from shapebucket.bucketed.calls import Side
    >>> call = Call(1, 2, {"source": Side("source", ["input_ids"], 2, 4)})
    >>> batch = {"attention_mask": torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])}
    >>> open_pad_rows(batch, call, {"source": "attention_mask"})
    >>> batch["attention_mask"].tolist()
    [[1, 1, 0, 0], [1, 0, 0, 0]]
    """
    if call.padded_rows == call.rows:
        return
    for side in call.sides:
        mask = batch.get(masks[side])
        if isinstance(mask, torch.Tensor) and mask.ndim == 2:
            mask[call.rows :, -1 if call.left else 0] = 1


#: output names (Hugging Face ``ModelOutput`` fields) whose length is the source's
_SOURCE_OUTPUTS = ("encoder_",)
#: attention outputs: ``[rows, heads, query, key]``
_ATTENTIONS = "attentions"


def _cut(t: torch.Tensor, dim: int, length: int, padded: int, left: bool) -> torch.Tensor:
    if t.ndim <= dim or t.shape[dim] != padded or length == padded:
        return t
    start = padded - length if left else 0
    return t.narrow(dim, start, length)


def _cut_tensor(t: torch.Tensor, name: str, call: Call) -> torch.Tensor:
    """One output tensor cut back to the call's rows and lengths.

    Rows: dim 0 when it has the padded rows. Lengths: dim 1 (logits, hidden states,
    per-token losses) of the side the output belongs to (``encoder_*``: the source,
    else the target of an encoder-decoder, else the source); attention weights
    ``[rows, heads, query, key]`` at their last two dims (a ``cross_attentions``'
    keys are the source's).
    """
    if t.ndim == 0:
        return t
    if t.shape[0] == call.padded_rows and call.rows != call.padded_rows:
        t = t[: call.rows]
    sides = call.sides
    source = sides.get("source") or sides["target"]
    own = source if name.startswith(_SOURCE_OUTPUTS) else sides.get("target", source)
    if _ATTENTIONS in name and t.ndim == 4:
        key = source if name.startswith("cross") else own
        t = _cut(t, 2, own.length, own.bucket, call.left)
        return _cut(t, 3, key.length, key.bucket, call.left)
    return _cut(t, 1, own.length, own.bucket, call.left)


def cut_outputs(out: Any, call: Call, name: str = "") -> Any:
    """Every tensor of ``out`` (a tensor, a dict or ``ModelOutput``, a tuple or list,
    nested) cut back to the call's shape; other values as they are.

    >>> from shapebucket.bucketed.calls import Side
    >>> call = Call(rows=2, padded_rows=4, sides={"source": Side("source", ["input_ids"], 5, 8)})
    >>> out = cut_outputs({"loss": torch.tensor(1.0), "logits": torch.zeros(4, 8, 3)}, call)
    >>> out["loss"].shape, out["logits"].shape
    (torch.Size([]), torch.Size([2, 5, 3]))
    """
    if not call.pads:
        return out
    if isinstance(out, torch.Tensor):
        return _cut_tensor(out, name, call)
    if isinstance(out, Mapping):
        fixed = {k: cut_outputs(v, call, str(k)) for k, v in out.items()}
        kind: Any = type(out)
        try:
            return kind(**fixed)  # a ModelOutput or a dict subclass of its fields
        except TypeError:
            return kind(fixed.items())
    fields = getattr(type(out), "_fields", None)  # a NamedTuple's (documented) field names
    if isinstance(out, tuple) and fields is not None:
        return type(out)(*(cut_outputs(v, call, f) for f, v in zip(fields, out, strict=True)))
    if isinstance(out, (tuple, list)):
        return type(out)(cut_outputs(v, call, name) for v in out)
    return out


def config_pad_values(model: Any) -> dict[str, Any]:
    """The model config's ``pad_token_id`` as the pad value of its token-id keys."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if isinstance(pad, int) and not isinstance(pad, bool):
        return {k: pad for k in ID_KEYS}
    return {}


def side_collator(
    buckets: Any, row_buckets: Sequence[int] | None, **options: Any
) -> BucketCollator:
    """The collator that re-pads one side of a call (rows padded to ``row_buckets``)."""
    if row_buckets is None:
        return BucketCollator(buckets, **options)
    return BucketCollator.with_row_buckets(buckets, row_buckets, **options)

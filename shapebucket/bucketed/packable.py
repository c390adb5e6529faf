"""Which models take a packed call (:mod:`.packed`): one rule, :func:`packs`."""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from typing import Any

from .. import _torch as compat
from .calls import parameters, takes

__all__ = ["PACKED_ATTENTION", "packs"]

#: the Hugging Face attention implementations whose mask reads packed samples from
#: ``position_ids`` for any number of rows (transformers 5.24 ``masking_utils.py``: the
#: sdpa, eager and flex mask functions are built by ``create_causal_mask``, which adds
#: the packed-sequence mask). ``flash_attention_*`` is left out: its packed path
#: (``_is_packed_sequence``) reads one flattened row only.
PACKED_ATTENTION = frozenset({"sdpa", "eager", "flex_attention"})
#: the config attribute naming a Hugging Face model's attention implementation
#: (transformers has no public accessor for it; its docs read it this way)
_ATTN_ATTRIBUTE = "_attn_implementation"


@functools.cache
def _causal_mask_reads_positions(cls: type) -> bool:
    """Whether a module defining ``cls`` or one of its bases calls ``create_causal_mask``
    with ``position_ids=`` (how a Hugging Face model hands its positions to the mask
    that finds packed samples; BERT, for one, calls it without them)."""
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        if module is None or not klass.__module__.startswith("transformers.models."):
            continue
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("create_causal_mask")
                and any(k.arg == "position_ids" for k in node.keywords)
            ):
                return True
    return False


def packs(model: Any) -> bool:
    """Whether ``model`` can take a packed call (:func:`~.packed.pack_into`) and give the
    same outputs as the padded call, by this rule (a ``torch.compile`` d model is
    judged by the module it wraps):

    (a) a Hugging Face decoder-only model (``config.is_encoder_decoder`` not True) whose
        ``forward`` takes ``position_ids``, whose modeling code hands ``position_ids`` to
        ``create_causal_mask`` and whose attention implementation is one of
        :data:`PACKED_ATTENTION` (sdpa, eager, flex_attention; not flash attention).
        Call it with ``use_cache=False``: with a cache, transformers skips the packed
        mask (checked in transformers 5.24);
    (b) any model whose ``forward`` takes ``document_ids`` (the bench ``GPT``: it masks
        attention by document, :func:`~shapebucket.document_causal_mask`).

    Everything else (encoders such as BERT, encoder-decoders such as T5, a plain module
    with a padding mask) is False: such a model keeps padded calls.

    >>> import torch
    >>> packs(torch.nn.Linear(2, 2)), packs(torch.compile(torch.nn.Linear(2, 2)))
    (False, False)
    """
    inner = compat.unwrap_compiled(model)
    params = parameters(inner)
    if takes(params, "document_ids"):
        return True
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) is True:
        return False
    if not takes(params, "position_ids"):
        return False
    if getattr(config, _ATTN_ATTRIBUTE, None) not in PACKED_ATTENTION:
        return False
    cls: Any = type(inner)  # a class is hashable (mypy reads type[Any] as not)
    return _causal_mask_reads_positions(cls)

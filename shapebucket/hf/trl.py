"""TRL's ``SFTTrainer`` with shapebucket's packing (needs ``trl``).

``SFTTrainer(packing=True)`` packs with best-fit decreasing into rows of
``max_length`` and then flattens each batch into one row whose length is the sum
of its samples (``padding_free``): a new length almost every step, so under
``torch.compile`` a recompile per length, then a dynamic graph. The class here
keeps everything of ``SFTTrainer`` (its dataset formats ``"text"``,
``"messages"``, prompt-completion or ready ``"input_ids"``, its tokenisation,
label building, loss and metrics) and changes only the training batches: they
come from :class:`~shapebucket.hf.PackedTrainer`'s sampler and collator, so every
batch is ``rows[L] x L`` for one of a few row lengths ``L``, with ``position_ids``
and no ``attention_mask``. Import it from ``shapebucket.hf.trl``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from trl import SFTTrainer

from ..collate.packed import PackedCollator
from ..errors import ShapeBucketError
from ._compat import count_train_tokens, tensor_parallel_size, train_tokens
from .trainers import PackedTrainer

__all__ = ["PackedSFTTrainer"]

#: The key the collator marks each token's sample with (-1 on padding); taken out of
#: the batch before the model sees it, it gives TRL's ``num_tokens`` metric the real
#: tokens (TRL counts ``position_ids.size(1)``, one flattened row's length).
DOCUMENT_KEY = "document_ids"


class PackedSFTTrainer(PackedTrainer, SFTTrainer):
    """``SFTTrainer`` whose training batches are shapebucket's packed batches.

    Built with :class:`PackedTrainer`'s constructors (``from_fit``, ``from_rows``,
    ``from_tokens``), followed by ``SFTTrainer``'s arguments (``model``,
    ``args=SFTConfig(...)``, ``train_dataset``, ``processing_class``, ...):
    ``from_tokens(tokens_per_batch, ...)`` fits the row lengths to the tokenised
    training set. ``lengths`` defaults to the lengths of
    the dataset ``SFTTrainer`` prepared (its ``input_ids``, truncated to
    ``max_length``), so it need not be known before tokenisation.

    ``SFTConfig(packing=False, padding_free=False)`` (the defaults) is required:
    the packing is this class's, and TRL's would flatten the batches again.
    ``use_cache`` needs nothing: ``SFTTrainer`` calls the model with
    ``use_cache=False``. With ``torch_compile=True`` every shape is prewarmed
    before the first step, as for :class:`PackedTrainer`.

    Example (``docs/examples/trl_sft.py`` runs one)::

        trainer = PackedSFTTrainer.from_tokens(4096, model=model,
                                               args=SFTConfig(..., torch_compile=True),
                                               train_dataset=ds, processing_class=tokenizer)
        trainer.train()
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        for name in ("packing", "padding_free"):
            if getattr(config, name, False):
                raise ShapeBucketError(
                    f"PackedSFTTrainer packs the training batches itself; SFTConfig({name}=True) "
                    f"would pack or flatten them again: pass SFTConfig({name}=False)"
                )
        super().__init__(*args, **kwargs)
        packed = cast(PackedCollator, self.collator)  # PackedTrainer.__init__ made it
        self.collator = dataclasses.replace(packed, document_key=DOCUMENT_KEY)

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """``SFTTrainer.compute_loss`` on the batch without its document ids, then TRL's
        ``num_tokens`` metric corrected to the batch's real tokens (TRL adds
        ``position_ids.size(1)``: the length of one row, not the tokens of ``rows`` rows
        less their padding)."""
        documents = inputs.get(DOCUMENT_KEY)
        inputs = {k: v for k, v in inputs.items() if k != DOCUMENT_KEY}
        before = train_tokens(self)
        out = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        if documents is not None and train_tokens(self) != before:  # a training step
            real = self.accelerator.gather_for_metrics((documents >= 0).sum()).sum().item()
            count_train_tokens(self, before + int(real) // tensor_parallel_size(self))
        return out

"""``PackedSFTTrainer``: TRL's ``SFTTrainer`` (its dataset formats, tokenisation, labels,
loss and metrics) with :class:`~shapebucket.hf.PackedTrainer`'s batches instead of
TRL's flattened ``padding_free`` rows (a new length almost every step; ``docs/integrations.md``).
Needs ``trl``."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from trl import SFTTrainer

from .._hf import count_train_tokens, tensor_parallel_size, train_tokens
from ..collate.packed import PackedCollator
from ..errors import ShapeBucketError
from .trainers import PackedTrainer

__all__ = ["PackedSFTTrainer"]

#: The key the collator marks each token's sample with (-1 on padding): taken out of the
#: batch before the model sees it, it counts the real tokens for TRL's ``num_tokens``.
DOCUMENT_KEY = "document_ids"


class PackedSFTTrainer(PackedTrainer, SFTTrainer):
    """``SFTTrainer`` whose training batches are shapebucket's packed batches.

    Built with :class:`PackedTrainer`'s constructors followed by ``SFTTrainer``'s
    arguments; ``lengths`` defaults to those of the dataset ``SFTTrainer`` tokenised.
    ``SFTConfig(packing=False, padding_free=False)`` (the defaults) is required: TRL's
    packing would flatten the batches again.

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

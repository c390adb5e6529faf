"""Hugging Face integrations (the ``hf`` extra): :class:`BucketTrainer` and
:class:`PackedTrainer` feed a ``transformers.Trainer`` shapebucket's batches and
prewarm every shape on the model the Trainer compiled; :mod:`shapebucket.hf.trl`
holds ``PackedSFTTrainer`` (needs ``trl``). The top-level package never imports
transformers.
"""

from .base import PrewarmCallback
from .trainers import BucketTrainer, PackedTrainer, Packing

__all__ = ["BucketTrainer", "PackedTrainer", "Packing", "PrewarmCallback"]

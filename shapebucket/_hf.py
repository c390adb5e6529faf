"""The one place shapebucket touches private names and internals of transformers and TRL
(:data:`PRIVATE`; and which models' masks find packed samples, :func:`masks_packed_positions`):
a release that changes one breaks this module alone: a Trainer or TRL name with a
:class:`~shapebucket.ShapeBucketError` naming the installed version and the name, the
config's ``_attn_implementation`` by the wrapper padding the model's calls instead of
packing them (the same outputs; ``tests/test_hf_compat.py`` checks each on the installed
versions). It imports neither package, so the wrapper
(``bucketed/``) and the integrations (``hf/``) both reach transformers through it."""

from __future__ import annotations

import ast
import copy
import functools
import importlib.metadata
import inspect
import sys
from typing import Any

from .errors import ShapeBucketError

__all__ = [
    "PACKED_ATTENTION",
    "PRIVATE",
    "CheckpointHook",
    "collator_without_unused_columns",
    "count_train_tokens",
    "counted",
    "dataset_without_unused_columns",
    "masks_packed_positions",
    "restore_counted",
    "tensor_parallel_size",
    "train_tokens",
]

#: Each private name, the class that defines it and the package that ships that class.
PRIVATE: dict[str, tuple[str, str]] = {
    "_remove_unused_columns": ("Trainer", "transformers"),
    "_get_collator_with_removed_columns": ("Trainer", "transformers"),
    "_save_checkpoint": ("Trainer", "transformers"),
    "_get_output_dir": ("Trainer", "transformers"),
    "_total_train_tokens": ("SFTTrainer", "trl"),
    "_tp_size": ("SFTTrainer", "trl"),
    "_metrics": ("SFTTrainer", "trl"),
    "_attn_implementation": ("PretrainedConfig", "transformers"),
}

#: the Hugging Face attention implementations whose mask reads packed samples from
#: ``position_ids`` for any number of rows (transformers 5.24 ``masking_utils.py``: the
#: sdpa, eager and flex mask functions are built by ``create_causal_mask``, which adds
#: the packed-sequence mask). ``flash_attention_*`` is left out: its packed path
#: (``_is_packed_sequence``) reads one flattened row only.
PACKED_ATTENTION = frozenset({"sdpa", "eager", "flex_attention"})


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


def masks_packed_positions(cls: type, config: Any) -> bool:
    """Whether a Hugging Face model of class ``cls`` with ``config`` finds packed samples
    from ``position_ids`` in its attention mask: its attention implementation (the
    config's private ``_attn_implementation``: transformers has no public accessor, its
    docs read it this way) is one of :data:`PACKED_ATTENTION`, and its modeling code hands
    ``position_ids`` to ``create_causal_mask``."""
    if getattr(config, "_attn_implementation", None) not in PACKED_ATTENTION:
        return False
    return _causal_mask_reads_positions(cls)


#: Trainer attributes a training step adds to (TRL's ``SFTTrainer`` metrics), put back
#: after the prewarm so its steps are not logged.
_COUNTED = ("_metrics", "_total_train_tokens")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def changed(name: str) -> ShapeBucketError:
    """The error for a private name the installed transformers or TRL lacks."""
    owner, package = PRIVATE[name]
    return ShapeBucketError(
        f"shapebucket uses {package}'s private {owner}.{name}, which {package} "
        f"{_version(package)} does not have (or has with another signature): install the "
        f"{package} version in shapebucket's constraints.txt, or report it so "
        "shapebucket/_hf.py follows the change"
    )


def _get(trainer: Any, name: str) -> Any:
    try:
        return getattr(trainer, name)
    except AttributeError:
        raise changed(name) from None


def _call(trainer: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    method = _get(trainer, name)
    try:
        return method(*args, **kwargs)
    except TypeError as e:  # a changed signature; a TypeError from inside is re-raised
        if e.__traceback__ is not None and e.__traceback__.tb_next is None:
            raise changed(name) from e
        raise


def dataset_without_unused_columns(trainer: Any, dataset: Any) -> Any:
    """``datasets.Dataset`` ``dataset`` without the columns the model does not take."""
    return _call(trainer, "_remove_unused_columns", dataset, description="Training")


def collator_without_unused_columns(trainer: Any, collate: Any) -> Any:
    """``collate`` behind the Trainer's filter of the columns the model does not take."""
    return _call(trainer, "_get_collator_with_removed_columns", collate, description="Training")


class CheckpointHook:
    """A mixin before ``Trainer``: after the Trainer saves a checkpoint, calls
    ``self.after_checkpoint(output_dir)`` with the directory that holds the checkpoints
    (of this hyperparameter-search ``trial``, when there is one)."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        _call(super(), "_save_checkpoint", model, trial)
        self.after_checkpoint(_call(self, "_get_output_dir", trial=trial))

    def after_checkpoint(self, output_dir: str) -> None:
        """Write what belongs beside the checkpoint just saved under ``output_dir``."""


def train_tokens(trainer: Any) -> int:
    """TRL's count of the tokens trained on so far."""
    return int(_get(trainer, "_total_train_tokens"))


def tensor_parallel_size(trainer: Any) -> int:
    """TRL's tensor-parallel size (the tokens metric is divided by it)."""
    return int(_get(trainer, "_tp_size"))


def count_train_tokens(trainer: Any, total: int) -> None:
    """Set TRL's tokens count, and its ``num_tokens`` training metric, to ``total``."""
    _get(trainer, "_total_train_tokens")
    setattr(trainer, "_total_train_tokens", total)  # noqa: B010 (the seam names it by string)
    metrics = _get(trainer, "_metrics")
    try:
        metrics["train"]["num_tokens"] = [total]
    except (KeyError, TypeError):
        raise changed("_metrics") from None


def counted(trainer: Any) -> dict[str, Any]:
    """A copy of what a training step adds to (TRL's metrics and tokens count; nothing for
    a plain ``Trainer``), for :func:`restore_counted` after the prewarm's steps."""
    return {k: copy.deepcopy(getattr(trainer, k)) for k in _COUNTED if hasattr(trainer, k)}


def restore_counted(trainer: Any, kept: dict[str, Any]) -> None:
    """Put back what :func:`counted` copied."""
    for k, v in kept.items():
        setattr(trainer, k, v)

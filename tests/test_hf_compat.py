"""shapebucket/_hf.py, the one seam to transformers' and TRL's private names: each
exists in the installed versions with the call shape the seam uses, and one that changed
is refused with a ShapeBucketError naming the package, its version and the name."""

import importlib.metadata
import inspect

import pytest
from _bucketed_models import model

pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from transformers import Trainer

from shapebucket import ShapeBucketError
from shapebucket import _hf as _compat


def _parameters(cls, name):
    return list(inspect.signature(getattr(cls, name)).parameters)


@pytest.mark.parametrize(
    ("name", "parameters"),
    [
        ("_remove_unused_columns", ["self", "dataset", "description"]),
        ("_get_collator_with_removed_columns", ["self", "data_collator", "description"]),
        ("_save_checkpoint", ["self", "model", "trial"]),
        ("_get_output_dir", ["self", "trial"]),
    ],
)
def test_each_private_trainer_method_exists_with_the_call_shape_the_seam_uses(name, parameters):
    assert _compat.PRIVATE[name] == ("Trainer", "transformers")
    assert _parameters(Trainer, name)[: len(parameters)] == parameters
    rest = inspect.signature(getattr(Trainer, name)).parameters
    assert all(
        p.default is not inspect.Parameter.empty for p in list(rest.values())[len(parameters) :]
    )


@pytest.mark.parametrize("name", ["_total_train_tokens", "_tp_size", "_metrics"])
def test_each_private_trl_attribute_is_set_by_sft_trainer(name):
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install .[trl])")
    assert _compat.PRIVATE[name] == ("SFTTrainer", "trl")
    assert f"self.{name} =" in inspect.getsource(trl.SFTTrainer)


def test_the_seam_lists_every_private_name_and_only_those():
    assert set(_compat.PRIVATE) == {
        "_remove_unused_columns",
        "_get_collator_with_removed_columns",
        "_save_checkpoint",
        "_get_output_dir",
        "_total_train_tokens",
        "_tp_size",
        "_metrics",
        "_attn_implementation",
    }


def test_the_config_names_its_attention_implementation_where_the_seam_reads_it():
    """What ``masks_packed_positions`` reads (``packs``' whole rule is tested in
    test_bucketed_packed.py): the installed transformers keeps the attention
    implementation a model was built with in ``config._attn_implementation``."""
    assert _compat.PRIVATE["_attn_implementation"] == ("PretrainedConfig", "transformers")
    llama = model("llama")  # built with attn_implementation="sdpa"
    assert llama.config._attn_implementation == "sdpa"
    assert _compat.masks_packed_positions(type(llama), llama.config)


class _Changed:
    """A trainer of a release that renamed or changed the private names."""

    def _remove_unused_columns(self, dataset):  # lost its description parameter
        return dataset


def test_a_missing_private_name_is_refused_naming_the_version_and_the_name():
    version = importlib.metadata.version("transformers")
    with pytest.raises(
        ShapeBucketError,
        match=rf"transformers's private Trainer._get_collator_with_removed_columns, which "
        rf"transformers {version} does not have",
    ):
        _compat.collator_without_unused_columns(_Changed(), lambda samples: samples)


def test_a_changed_signature_is_refused_but_an_error_inside_is_not_hidden():
    with pytest.raises(
        ShapeBucketError, match=r"Trainer._remove_unused_columns.*another signature"
    ):
        _compat.dataset_without_unused_columns(_Changed(), [1])

    class Raises:
        def _remove_unused_columns(self, dataset, description):
            raise TypeError("a bug inside transformers")

    with pytest.raises(TypeError, match="a bug inside transformers"):
        _compat.dataset_without_unused_columns(Raises(), [1])


def test_trl_counters_missing_are_refused_naming_trl():
    with pytest.raises(ShapeBucketError, match=r"trl's private SFTTrainer._total_train_tokens"):
        _compat.train_tokens(object())


def test_counted_state_is_copied_and_put_back():
    class T:
        def __init__(self):
            self._metrics = {"train": {"num_tokens": [3]}}
            self._total_train_tokens = 3

    t = T()
    kept = _compat.counted(t)
    _compat.count_train_tokens(t, 10)
    assert t._total_train_tokens == 10 and t._metrics["train"]["num_tokens"] == [10]
    _compat.restore_counted(t, kept)
    assert t._total_train_tokens == 3 and t._metrics["train"]["num_tokens"] == [3]

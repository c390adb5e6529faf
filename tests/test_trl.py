"""PackedSFTTrainer: TRL's SFTTrainer (its dataset formats, tokenisation and loss) fed
shapebucket's packed batches, every shape compiled before the first step."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback
from trl import SFTConfig

from shapebucket import ShapeBucketError, ShapePlan
from shapebucket.compile import CompileCounter
from shapebucket.hf.trl import PackedSFTTrainer

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "trl_sft.py"
sys.path.insert(0, str(EXAMPLE.parent))
from trl_sft import byte_tokenizer  # noqa: E402

TEXTS = [("word " * n).strip() for n in range(1, 40)]


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=258,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=256,
        pad_token_id=257,
    )
    return LlamaForCausalLM(config)


def config(out, **kwargs):
    return SFTConfig(
        output_dir=str(out),
        max_steps=4,
        max_length=256,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **kwargs,
    )


class Steps(TrainerCallback):
    def __init__(self, counter):
        self.counter, self.graphs = counter, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.graphs.append(self.counter.graphs)


@pytest.mark.parametrize("form", [pytest.param("text", marks=pytest.mark.slow), "input_ids"])
def test_sft_trains_on_packed_shapes_prewarmed(tmp_path, form, fresh_compiler):
    tok = byte_tokenizer()
    if form == "text":
        ds = Dataset.from_dict({"text": TEXTS})
    else:  # already tokenised: SFTTrainer skips its tokenisation
        ds = Dataset.from_dict({"input_ids": [tok(t)["input_ids"] for t in TEXTS]})
    # compiled (eager backend: the bookkeeping) for "text"; the other format trains eagerly
    compiled = form == "text"
    args = config(tmp_path, **({"torch_compile_backend": "eager"} if compiled else {}))
    trainer = PackedSFTTrainer.from_tokens(
        512,
        model=tiny_llama(),
        args=args,
        train_dataset=ds,
        processing_class=tok,
        buckets=[256],
        pad_values={"input_ids": 257},
    )
    # the lengths were read from the dataset SFTTrainer tokenised
    assert trainer.sampler.stats.num_samples == len(TEXTS)
    with CompileCounter() as cc:
        steps = Steps(cc)
        trainer.add_callback(steps)
        trainer.train()
    assert trainer.state.global_step == 4
    assert trainer.collator.stats.batches_per_bucket == {256: 4}  # one shape: 2 x 256
    # TRL's num_tokens metric counts the real tokens trained (TRL alone counted 256 a step)
    assert trainer._total_train_tokens == trainer.collator.stats.real_tokens > 4 * 256
    if compiled:
        plan = ShapePlan.of(trainer.collator, trainer.sampler)
        assert trainer.prewarm_report.num_shapes == len(plan) == 1
        assert steps.graphs == [steps.graphs[0]] * 4 and cc.graphs == steps.graphs[0]  # 0 after
    else:
        assert trainer.prewarm_report is None and cc.graphs == 0


def test_trl_packing_or_padding_free_is_refused(tmp_path):
    for flag in ("packing", "padding_free"):
        with pytest.raises(ShapeBucketError, match=f"SFTConfig\\({flag}=False\\)"):
            PackedSFTTrainer.from_tokens(
                512,
                model=tiny_llama(),
                args=config(tmp_path, **{flag: True}),
                train_dataset=Dataset.from_dict({"text": TEXTS}),
                processing_class=byte_tokenizer(),
            )


@pytest.mark.slow
def test_example_runs_and_never_recompiles(monkeypatch, capsys, fresh_compiler):
    # dynamo with the eager backend: the bookkeeping TRL's Trainer could break (the
    # shapes, the prewarm on the compiled model, no graph after it); inductor itself
    # runs in tests/test_hf.py's example test, through the same prewarm hook. The example
    # runs as pasted (its __main__ block) in this process, which has imported TRL already:
    # a fresh compiler, one torch thread (module fixture), os.environ restored after it
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "4", "--samples", "300", "--backend", "eager"])
    env = dict(os.environ)
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        os.environ.clear()
        os.environ.update(env)
    out = capsys.readouterr().out
    result = json.loads([x for x in out.splitlines() if x.startswith("{")][-1])
    assert result["steps"] == 4 and result["graphs_after_prewarm"] == 0
    assert result["prewarm_shapes"] == len(result["buckets"]) >= 1

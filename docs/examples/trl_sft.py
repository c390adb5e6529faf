"""TRL's SFTTrainer with shapebucket's packing: a few static shapes, prewarmed.

A small Llama from a config and a byte-level tokenizer built in code (no
download) fine-tune on a "text" dataset (the paragraphs of the standard
library's docstrings). ``PackedSFTTrainer`` keeps SFTTrainer's dataset formats
("text", "messages", prompt-completion, "input_ids"), tokenisation and loss, and
packs the training batches into rows of a few row lengths fitted to the
tokenised lengths. Needs: pip install 'shapebucket[trl]'. --samples: paragraphs in the dataset (default 2000).

    python docs/examples/trl_sft.py [STEPS] [--backend inductor|eager] [--samples N]

Prints one JSON line: steps, row lengths, shapes, graphs after the prewarm.
"""

import argparse
import json
import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import SFTConfig

from shapebucket.bench.workloads import stdlib_docstring_paragraphs
from shapebucket.compile import CompileCounter
from shapebucket.hf.trl import PackedSFTTrainer


def byte_tokenizer():
    """256 byte tokens, <eos> = 256, <pad> = 257."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<eos>": 256, "<pad>": 257})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


class GraphsAtFirstStep(TrainerCallback):
    def __init__(self, counter):
        self.counter, self.graphs = counter, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.graphs is None:
            self.graphs = self.counter.graphs


def main():
    cli = argparse.ArgumentParser()
    cli.add_argument("steps", type=int, nargs="?", default=8)
    cli.add_argument("--backend", default="inductor")
    cli.add_argument("--samples", type=int, default=2000)
    opts = cli.parse_args()
    texts = [t for t in stdlib_docstring_paragraphs() if len(t.encode()) >= 2]
    ds = Dataset.from_dict({"text": texts[: opts.samples]})
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=258,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=256,
            eos_token_id=256,
            bos_token_id=256,
            pad_token_id=257,
        )
    )
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            max_steps=opts.steps,
            max_length=256,  # SFTTrainer truncates to it; the longest row length
            learning_rate=1e-3,
            torch_compile=True,
            torch_compile_backend=opts.backend,
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            logging_steps=opts.steps,
            seed=0,
        )
        trainer = PackedSFTTrainer.from_tokens(
            1024,  # tokens per batch: the row lengths are fitted to the tokenised lengths
            model=model,
            args=args,
            train_dataset=ds,
            processing_class=byte_tokenizer(),
            pad_values={"input_ids": 257},
        )
        with CompileCounter() as cc:
            first = GraphsAtFirstStep(cc)
            trainer.add_callback(first)
            trainer.train()
    print(
        json.dumps(
            {
                "steps": trainer.state.global_step,
                "buckets": list(trainer.buckets),
                "rows": trainer.sampler.rows,
                "batches_per_bucket": trainer.collator.stats.batches_per_bucket,
                "token_efficiency": round(trainer.collator.stats.token_efficiency, 3),
                "prewarm_shapes": trainer.prewarm_report.num_shapes,
                "graphs_after_prewarm": cc.graphs - first.graphs,
                "recompiles": len(cc.recompiles),
            }
        )
    )


if __name__ == "__main__":
    main()

"""shapebucket with a Hugging Face Trainer and torch_compile=True: buckets or packing.

A small Llama built from a config (no download) learns to predict the next byte
of the paragraphs of the docstrings in Python's standard library (real text, on
every machine, offline). Every shape of the plan is compiled before the first
step (a progress bar, the time in the Trainer's log), with the compiler's cache
in OUT/compile-cache: run it twice with the same OUT and the second prewarm
loads from the cache. Needs: pip install 'shapebucket[hf]'.

    python docs/examples/hf_trainer.py [STEPS] [--packing] [--out OUT] [--k K]
        [--backend inductor|eager] [--no-compile]

Prints one JSON line: steps, batches per bucket, graphs compiled in all and after
the prewarm, recompile-limit hits, the prewarm's seconds and whether it loaded the
cache. ``--no-compile`` trains eagerly (``benchmarks/first_step_hf.py`` times the first
step of all three: eager, compiled cold and compiled from the cache).
"""

import argparse
import json
import tempfile

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments

import shapebucket
from shapebucket.bench.workloads import stdlib_docstring_paragraphs
from shapebucket.compile import CompileCounter
from shapebucket.hf import BucketTrainer, PackedTrainer

MAX_LEN = 128


class Paragraphs(torch.utils.data.Dataset):
    def __init__(self):  # paragraphs longer than MAX_LEN bytes are cut, on purpose
        self.data = [
            list(t.encode()[:MAX_LEN])
            for t in stdlib_docstring_paragraphs()
            if len(t.encode()) >= 2
        ]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):  # a Hugging Face causal LM shifts the labels itself
        return {"input_ids": self.data[i], "labels": self.data[i]}


class GraphsAtFirstStep(TrainerCallback):
    """Graphs compiled so far when the first step begins (after the prewarm)."""

    def __init__(self, counter):
        self.counter, self.graphs = counter, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.graphs is None:
            self.graphs = self.counter.graphs


def main():
    cli = argparse.ArgumentParser()
    cli.add_argument("steps", type=int, nargs="?", default=16)
    cli.add_argument("--packing", action="store_true", help="pack samples into rows")
    cli.add_argument("--out", help="output dir (default: a temporary one)")
    cli.add_argument("--backend", help="torch_compile_backend (default inductor)")
    cli.add_argument("--k", type=int, help="shapes: row lengths or buckets (default 3 or 4)")
    cli.add_argument("--no-compile", action="store_true", help="train eagerly (no prewarm)")
    opts = cli.parse_args()
    for flag, value in (("steps", opts.steps), ("--k", opts.k)):
        if value is not None and value < 1:  # 0 steps would be 3 whole epochs to the Trainer
            cli.error(f"argument {flag}: must be >= 1, got {value}")
    if opts.no_compile and opts.backend:
        cli.error(f"--backend {opts.backend} compiles; --no-compile trains eagerly: pass one")
    opts.backend = opts.backend or "inductor"
    ds = Paragraphs()
    lengths = np.array([len(x) for x in ds.data])
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=MAX_LEN,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=opts.out or tmp,
            max_steps=opts.steps,
            per_device_train_batch_size=8,
            learning_rate=1e-3,
            # the Trainer compiles, the shapebucket trainer prewarms that model (a backend
            # alone turns compiling on, so --no-compile passes none)
            torch_compile=not opts.no_compile,
            torch_compile_backend=None if opts.no_compile else opts.backend,
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            logging_steps=opts.steps,
            seed=0,
        )
        if opts.packing:  # 3 row lengths, 512 tokens per batch
            fit = shapebucket.fit_packing(lengths, k=opts.k or 3, tokens_per_batch=512)
            trainer = PackedTrainer.from_fit(
                fit, model=model, args=args, train_dataset=ds, lengths=lengths
            )
        else:
            buckets = shapebucket.fit_buckets(lengths, k=opts.k or 4, align=8)
            trainer = BucketTrainer(
                model=model, args=args, train_dataset=ds, lengths=lengths, buckets=buckets
            )
        with CompileCounter() as cc:
            first = GraphsAtFirstStep(cc)
            trainer.add_callback(first)
            result = trainer.train()
    report = trainer.prewarm_report
    print(
        json.dumps(
            {
                "steps": trainer.state.global_step,
                "buckets": list(trainer.buckets),
                "batches_per_bucket": trainer.collator.stats.batches_per_bucket,
                "graphs": cc.graphs,
                "graphs_after_prewarm": cc.graphs - first.graphs,
                "limit_hits": len(cc.limit_hits),
                "prewarm_shapes": report.num_shapes if report else 0,  # None: eager
                "prewarm_seconds": round(report.total_seconds + report.verify_seconds, 2)
                if report
                else 0.0,
                "cache_loaded": report.cache_loaded if report else False,
                "train_loss": result.training_loss,
            }
        )
    )


if __name__ == "__main__":
    main()

"""shapebucket with a Hugging Face Trainer and torch_compile=True.

A small GPT-2 built from a config (no download) learns to predict the next byte
of the paragraphs of the docstrings in Python's standard library (real text, on
every machine, offline). Needs: pip install 'shapebucket[hf]'.

    python docs/examples/hf_trainer.py [STEPS]

Prints one JSON line: steps, batches per bucket, graphs compiled, recompile-limit hits.
"""

import json
import sys
import tempfile

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import shapebucket
from shapebucket.bench.workloads import stdlib_docstring_paragraphs
from shapebucket.compile import CompileCounter
from shapebucket.hf import BucketTrainer

MAX_LEN = 128
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 16


class Paragraphs(torch.utils.data.Dataset):
    def __init__(self):  # paragraphs longer than MAX_LEN bytes are cut, on purpose
        self.data = [
            list(t.encode()[:MAX_LEN])
            for t in stdlib_docstring_paragraphs()
            if len(t.encode()) >= 2
        ]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):  # GPT-2 shifts the labels itself
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main():
    ds = Paragraphs()
    lengths = np.array([len(x) for x in ds.data])
    buckets = shapebucket.fit_buckets(lengths, k=4, align=8)
    config = GPT2Config(
        vocab_size=256,
        n_positions=MAX_LEN,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=STEPS,
            per_device_train_batch_size=8,
            learning_rate=1e-3,
            torch_compile=True,
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            logging_steps=STEPS,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = BucketTrainer(
            model=model, args=args, train_dataset=ds, lengths=lengths, buckets=buckets
        )
        with CompileCounter() as cc:
            result = trainer.train()
    stats = trainer.bucket_collator.stats
    print(
        json.dumps(
            {
                "steps": trainer.state.global_step,
                "buckets": list(buckets),
                "batches_per_bucket": stats.batches_per_bucket,
                "graphs": cc.graphs,
                "limit_hits": len(cc.limit_hits),
                "train_loss": result.training_loss,
            }
        )
    )


if __name__ == "__main__":
    main()

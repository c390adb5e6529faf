"""TRL's SFTTrainer: its own packing against shapebucket's PackedSFTTrainer.

A small Llama from a config (no download), a byte-level tokenizer built in code,
the paragraphs of the standard library's docstrings as a "text" dataset, on CPU.
For each setup, STEPS training steps with the same token budget per batch:

* ``trl-packing``: ``SFTConfig(packing=True)`` (strategy ``bfd``, which turns
  ``padding_free`` on: each batch is one flattened row of a new length);
* ``shapebucket``: ``PackedSFTTrainer.from_tokens(...)`` (rows of a few
  fitted row lengths, every shape prewarmed before the first step when compiled).

Every run starts with ``torch.compiler.reset()``. Measured: graphs compiled and
recompiles during the steps (after the prewarm), the prewarm's
seconds, the steps' seconds, and useful (non-pad) tokens per second over all
steps (compiles included) and over the second half of the steps (steady state).

    python benchmarks/trl_sft.py [--compile eager|inductor|none] [--steps 20] [--runs 3]

Prints one JSON line per run and a median table.
"""

import argparse
import json
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from shapebucket.bench.workloads import stdlib_docstring_paragraphs
from shapebucket.compile import CompileCounter
from shapebucket.hf.trl import PackedSFTTrainer

MAX_LEN = 256
TOKENS = 1024  # tokens per batch: 4 rows of MAX_LEN for TRL
PAD = 257


def byte_tokenizer():
    """256 byte tokens, <eos> = 256, <pad> = 257 (no download)."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<eos>": 256, "<pad>": PAD})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=258,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_LEN,
        eos_token_id=256,
        bos_token_id=256,
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(config)


def timed(trainer, log):
    """Wrap ``training_step``: seconds and useful tokens of every step (prewarm's excluded)."""
    inner = trainer.training_step

    def step(model, inputs, *args, **kwargs):
        t0 = time.perf_counter()
        loss = inner(model, inputs, *args, **kwargs)
        loss.item()
        if trainer.state.global_step >= 0 and log.get("on", False):
            log["seconds"].append(time.perf_counter() - t0)
            log["tokens"].append(int((inputs["input_ids"] != PAD).sum()))
        return loss

    trainer.training_step = step


def run(setup, backend, steps, out):
    torch.compiler.reset()  # every run compiles from nothing (graphs of earlier runs are dropped)
    texts = [t for t in stdlib_docstring_paragraphs() if len(t.encode()) >= 2]
    ds = Dataset.from_dict({"text": texts})
    common = {
        "output_dir": out,
        "max_steps": steps,
        "max_length": MAX_LEN,
        "per_device_train_batch_size": TOKENS // MAX_LEN,
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
        "seed": 0,
        "torch_compile": backend != "none",
        **({"torch_compile_backend": backend} if backend != "none" else {}),
    }
    if setup == "shapebucket":
        trainer = PackedSFTTrainer.from_tokens(
            TOKENS,
            model=model(),
            args=SFTConfig(**common),
            train_dataset=ds,
            processing_class=byte_tokenizer(),
            pad_values={"input_ids": PAD},
        )
    else:
        trainer = SFTTrainer(
            model=model(),
            args=SFTConfig(packing=True, **common),
            train_dataset=ds,
            processing_class=byte_tokenizer(),
        )
    log = {"seconds": [], "tokens": [], "on": False}
    timed(trainer, log)
    start = time.perf_counter()
    orig = trainer.callback_handler.on_train_begin

    def begin(*a, **k):  # the steps start after the prewarm (which runs in on_train_begin)
        out = orig(*a, **k)
        log["on"] = True
        log["graphs0"], log["recompiles0"] = cc.graphs, len(cc.recompiles)
        return out

    trainer.callback_handler.on_train_begin = begin
    with CompileCounter() as cc:
        trainer.train()
    wall = time.perf_counter() - start
    half = len(log["seconds"]) // 2
    report = getattr(trainer, "prewarm_report", None)
    prewarm = report.total_seconds + report.verify_seconds if report else 0.0
    return {
        "setup": setup,
        "compile": backend,
        "steps": len(log["seconds"]),
        "graphs_in_steps": cc.graphs - log["graphs0"],
        "recompiles": len(cc.recompiles) - log["recompiles0"],
        "prewarm_s": round(prewarm, 2),
        "steps_s": round(sum(log["seconds"]), 2),
        "wall_s": round(wall, 2),
        "tokens_per_s": round(sum(log["tokens"]) / sum(log["seconds"]), 1),
        "tokens_per_s_with_prewarm": round(sum(log["tokens"]) / (sum(log["seconds"]) + prewarm), 1),
        "steady_tokens_per_s": round(sum(log["tokens"][half:]) / sum(log["seconds"][half:]), 1),
        "tokens_per_step": round(statistics.mean(log["tokens"]), 1),
    }


def main():
    cli = argparse.ArgumentParser()
    cli.add_argument("--compile", default="eager", choices=["none", "eager", "inductor"])
    cli.add_argument("--steps", type=int, default=20)
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--setups", default="trl-packing,shapebucket")
    opts = cli.parse_args()
    results = []
    for _ in range(opts.runs):  # interleaved, so load on the machine hits both alike
        for setup in opts.setups.split(","):
            with tempfile.TemporaryDirectory() as out:
                r = run(setup, opts.compile, opts.steps, out)
            print(json.dumps(r), flush=True)
            results.append(r)
    keys = ["graphs_in_steps", "recompiles", "prewarm_s", "steps_s", "tokens_per_s"]
    keys += ["tokens_per_s_with_prewarm", "steady_tokens_per_s"]
    print(f"{'setup':<12} {'compile':<8} " + " ".join(f"{k:>14}" for k in keys))
    for setup in opts.setups.split(","):
        rs = [r for r in results if r["setup"] == setup]
        cells = []
        for k in keys:
            vals = [r[k] for r in rs]
            cells.append(f"{statistics.median(vals):>8g} ±{(max(vals) - min(vals)) / 2:<5.3g}")
        print(f"{setup:<12} {opts.compile:<8} " + " ".join(cells))


if __name__ == "__main__":
    main()

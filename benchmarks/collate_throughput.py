"""Samples/sec of BucketCollator against two references, and against an earlier version.

The references, both padding to the batch's longest sample rounded up to 8 (what
``Buckets.multiples(8, 256)`` gives BucketCollator here):

* the naive loop most training scripts have: per-sample ``F.pad``, then ``stack``;
* Hugging Face's ``DataCollatorWithPadding(pad_to_multiple_of=8)`` (needs the
  ``hf`` extra; a word-level tokenizer built in memory supplies the pad id).

Inputs, batch 64, the project's length mixture: dicts of Python lists
(``input_ids`` and ``attention_mask``, as a tokenizer returns them), and dicts
of int64 tensors (``input_ids`` and ``labels``). Every contender collates the
same batches in one process, interleaved round by round, so machine noise hits
all alike; the table gives the median over rounds and the spread (min-max).

``--before DIR`` adds an earlier shapebucket as a contender: ``DIR`` holds a
copy of the package renamed ``shapebucket_before``, e.g.

    git archive 2cbd5fb shapebucket | tar -x -C /tmp/b && mv /tmp/b/shapebucket /tmp/b/shapebucket_before
    PYTHONPATH=. python benchmarks/collate_throughput.py --before /tmp/b
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from shapebucket import BucketCollator
from shapebucket.data import mixture_lengths
from shapebucket.fit.buckets import Buckets

Batch = list[dict[str, Any]]


def naive_loop(samples: Batch) -> dict[str, torch.Tensor]:
    """Per-sample F.pad to the longest length rounded up to 8, then stack; a bool mask."""
    longest = max(len(s["input_ids"]) for s in samples)
    target = -(-longest // 8) * 8
    out = {}
    for key in samples[0]:
        pad = -100 if key == "labels" else 0
        out[key] = torch.stack(
            [F.pad(torch.as_tensor(s[key]), (0, target - len(s[key])), value=pad) for s in samples]
        )
    if "attention_mask" not in out:
        ones = [torch.ones(len(s["input_ids"]), dtype=torch.bool) for s in samples]
        out["attention_mask"] = torch.stack([F.pad(m, (0, target - len(m))) for m in ones])
    return out


def hf_collator() -> Callable[[Batch], Any] | None:
    """``DataCollatorWithPadding(pad_to_multiple_of=8)`` with a pad id of 0, or None."""
    try:
        from tokenizers import Tokenizer, models
        from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast
    except ImportError:
        return None
    vocab = {"[PAD]": 0, "[UNK]": 1}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")), pad_token="[PAD]"
    )
    tok.deprecation_warnings["Asking-to-pad-a-fast-tokenizer"] = True  # silence the advice
    return DataCollatorWithPadding(tok, pad_to_multiple_of=8, return_tensors="pt")


def make_batches(n_batches: int, batch_size: int, as_tensors: bool, seed: int = 0) -> list[Batch]:
    lengths = mixture_lengths(n_batches * batch_size, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(n_batches):
        batch = []
        for n in lengths[b * batch_size : (b + 1) * batch_size]:
            ids = torch.randint(1, 32_000, (int(n),), generator=gen)
            if as_tensors:
                batch.append({"input_ids": ids, "labels": ids.clone()})
            else:
                batch.append({"input_ids": ids.tolist(), "attention_mask": [1] * int(n)})
        batches.append(batch)
    return batches


def samples_per_sec(fn: Callable[[Batch], Any], batches: list[Batch]) -> float:
    start = time.perf_counter()
    for batch in batches:
        fn(batch)
    return sum(len(b) for b in batches) / (time.perf_counter() - start)


def _same(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    return all(
        torch.equal(ours[k].to(torch.int64), torch.as_tensor(theirs[k]).to(torch.int64))
        for k in ("input_ids", "attention_mask")
    )


def contenders(before: str | None) -> dict[str, Callable[[Batch], Any]]:
    found: dict[str, Callable[[Batch], Any]] = {
        "BucketCollator": BucketCollator(Buckets.multiples(8, 256))
    }
    if before is not None:
        sys.path.insert(0, before)
        old = importlib.import_module("shapebucket_before")
        found["before"] = old.BucketCollator(list(Buckets.multiples(8, 256)))
    found["naive loop"] = naive_loop
    hf = hf_collator()
    if hf is not None:
        found["HF DataCollatorWithPadding"] = hf
    return found


def run(rounds: int, n_batches: int, batch_size: int, before: str | None) -> dict[str, Any]:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*fast tokenizer.*")
    fns = contenders(before)
    results: dict[str, Any] = {}
    for label, as_tensors in (("lists", False), ("tensors", True)):
        batches = make_batches(n_batches, batch_size, as_tensors)
        runs = {
            name: fn
            for name, fn in fns.items()
            if not (as_tensors and name.startswith("HF"))  # HF's collator takes lists
        }
        want = runs["BucketCollator"](batches[0])
        for name, fn in runs.items():
            if not _same(want, fn(batches[0])):
                raise SystemExit(f"BucketCollator and {name} disagree; benchmark aborted")
        sps: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, fn in runs.items():
                sps[name].append(samples_per_sec(fn, batches))
        ours = sps["BucketCollator"]
        results[label] = {
            name: {
                "median": statistics.median(v),
                "min": min(v),
                "max": max(v),
                "ratio": statistics.median([a / b for a, b in zip(ours, v, strict=True)]),
                "ratio_min": min(a / b for a, b in zip(ours, v, strict=True)),
                "ratio_max": max(a / b for a, b in zip(ours, v, strict=True)),
            }
            for name, v in sps.items()
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--before", default=None, help="a folder holding shapebucket_before/")
    args = parser.parse_args()
    results = run(args.rounds, args.batches, args.batch_size, args.before)
    print(
        f"torch {torch.__version__}, batch {args.batch_size}, mixture lengths, 1 thread, "
        f"{args.rounds} interleaved rounds: median samples/s (min-max), and BucketCollator's "
        "ratio to each (median, min-max over rounds)"
    )
    for label, table in results.items():
        print(f"{label}:")
        for name, r in table.items():
            print(
                f"  {name:28s} {r['median']:10,.0f}/s ({r['min']:,.0f}-{r['max']:,.0f})"
                f"   ours/this {r['ratio']:5.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
            )


if __name__ == "__main__":
    main()

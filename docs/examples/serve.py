"""Serve variable batches of variable lengths through a compiled model, 0 recompiles.

Requests arrive in batches of 1 to 16 prompts of 3 to 64 tokens. Each batch is
padded to a length bucket (16, 32, 64) *and* a batch-size bucket (1, 4, 16),
like the capture sizes of serving systems, so the model sees at most 9 shapes;
`prewarm(model, ShapePlan.of(collate), example, modes=[Inference()])` compiles
all 9 forward-only under `torch.inference_mode()` before the first request, and
the serving loop runs inside `no_recompiles()`.

    python docs/examples/serve.py [requests] [--backend inductor|eager]
"""

from __future__ import annotations

import argparse
import random

import torch

import shapebucket
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.compile import CompileCounter, Inference
from shapebucket.fit.buckets import Buckets

LENGTHS = Buckets([16, 32, 64])
BATCHES = [1, 4, 16]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("requests", nargs="?", type=int, default=40)
    p.add_argument(
        "--backend", default="inductor", help="torch.compile backend (eager: fast, for tests)"
    )
    args = p.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=100, dim=32, layers=2, heads=4, max_len=64)).eval()
    collate = shapebucket.BucketCollator.with_row_buckets(
        LENGTHS, BATCHES, sequence_keys=["input_ids"]
    )

    def serve(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # the next token after each prompt's last real token (pad rows: an answer nobody reads)
        logits = model.logits(input_ids, attention_mask=attention_mask)
        last = (attention_mask.sum(1) - 1).clamp(min=0)
        return logits[torch.arange(len(last)), last].argmax(-1)

    compiled = torch.compile(serve, dynamic=False, backend=args.backend)
    rng = random.Random(0)

    def request(n: int) -> list[dict]:
        return [
            {"input_ids": [rng.randrange(100) for _ in range(rng.randint(3, 64))]} for _ in range(n)
        ]

    plan = shapebucket.ShapePlan.of(collate)  # every length at every batch-size bucket
    report = shapebucket.prewarm(
        compiled, plan, collate(request(1)), modes=[Inference()], progress=False
    )
    print(
        f"prewarm: {report.total_graphs} graphs for {len(LENGTHS)} lengths x {len(BATCHES)} batch sizes"
    )
    served = 0
    with CompileCounter() as cc, shapebucket.no_recompiles(plan):
        for _ in range(args.requests):
            prompts = request(rng.randint(1, max(BATCHES)))
            # made outside inference mode, as a DataLoader makes them and as prewarm made its
            # batches: dynamo guards on whether an input is an inference tensor
            batch = collate(prompts)
            with torch.inference_mode():
                out = compiled(**batch)[: len(prompts)]  # drop the pad rows' answers
            served += len(out)
    print(
        f"served {served} prompts in {args.requests} batches: {cc.graphs} graphs compiled, 0 recompiles"
    )


if __name__ == "__main__":
    main()

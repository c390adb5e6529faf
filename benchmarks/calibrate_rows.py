"""Rows calibrated to memory against the rows a token budget gives, on the bench GPT and
on a small Hugging Face Llama built from a config (no download).

    python benchmarks/calibrate_rows.py [--model gpt|llama|both] [--k 8]
        [--device cpu|cuda] [--dim 128] [--json PATH]

The lengths are the bench's fitted buckets of the mixture workload (k buckets, up to
256). The token budget is the bench's: ``tokens_per_batch = 64 x 32 = 2,048`` gives
bucket ``L`` ``2048 // L`` rows. The memory budget is the measured peak of the token
budget's longest bucket (its rows at 256), with no margin: the calibration then keeps
every shape within what the token budget already needs at its worst, and shows how
many rows fit at the shorter lengths under that same peak. Prints each length's
calibrated rows, peak, the bracketing row count and its peak, the token budget's rows
and its peak, the calibration's seconds and the load average. On CUDA the steps run
under bf16 autocast, as the bench's do, and the peaks are the CUDA allocator's.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from shapebucket.bench.batching import step_autocast
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.bench.workloads import load_workload
from shapebucket.calibrate import calibrate_rows, steady_peak_bytes
from shapebucket.calibrate.report import size
from shapebucket.fit import fit_buckets
from shapebucket.plan import Shape

TOKENS = 64 * 32
DEVICE = torch.device("cpu")
DIM = 128


def gpt() -> torch.nn.Module:
    return GPT(GPTConfig(vocab=512, dim=DIM, layers=2, heads=4, max_len=256))


def llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=DIM,
        intermediate_size=2 * DIM,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        use_cache=False,
    )
    return LlamaForCausalLM(cfg)


def make_batch(shape: Shape) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 512, (shape.rows, shape.length), device=DEVICE)
    return {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}


def setup(name: str):
    torch.manual_seed(0)
    model = (gpt() if name == "gpt" else llama()).to(DEVICE)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    autocast = step_autocast(DEVICE)  # the bench's precision: bf16 autocast on CUDA

    def step(batch):
        with autocast:
            out = model(**batch)
        loss = out if isinstance(out, torch.Tensor) else out.loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step


def peak_of(name: str, rows: int, length: int) -> int:
    model, opt, step = setup(name)
    batch = make_batch(Shape(rows, length))
    return steady_peak_bytes(lambda: step(batch), model, opt, batch, device=DEVICE)


def run(name: str, buckets: list[int]) -> dict:
    load0 = tuple(round(x, 2) for x in os.getloadavg())
    token_rows = {L: TOKENS // L for L in buckets}
    token_peak = {L: peak_of(name, token_rows[L], L) for L in buckets}
    budget = token_peak[max(buckets)]
    model, opt, step = setup(name)
    t0 = time.perf_counter()
    report = calibrate_rows(
        model, buckets, budget, make_batch, step=step, restore=[opt], margin=0.0
    )
    wall = time.perf_counter() - t0
    load1 = tuple(round(x, 2) for x in os.getloadavg())
    print(
        f"\n== {name} (width {DIM}, {DEVICE}): budget {size(budget)} (the token budget's peak "
        f"at {max(buckets)}), margin 0"
    )
    print(report)
    print(f"{'length':>8} {'token rows':>10} {'token peak':>11} {'calibrated':>10} {'x':>6}")
    for L in buckets:
        print(
            f"{L:>8} {token_rows[L]:>10} {size(token_peak[L]):>11} {report.rows[L]:>10} "
            f"{report.rows[L] / token_rows[L]:>5.2f}x"
        )
    tok = sum(token_rows[L] * L for L in buckets) / len(buckets)
    cal = sum(report.rows[L] * L for L in buckets) / len(buckets)
    print(f"mean tokens per batch over the lengths: token budget {tok:,.0f}, calibrated {cal:,.0f}")
    print(
        f"calibration {wall:.1f} s, {report.steps()} steps; load average before {load0}, after {load1}"
    )
    return {
        "model": name,
        "width": DIM,
        "device": str(DEVICE),
        "budget_bytes": budget,
        "token_rows": token_rows,
        "token_peak_bytes": token_peak,
        "calibrated_rows": dict(report.rows),
        "calibration_s": wall,
        "steps": report.steps(),
        "report": str(report),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        choices=["gpt", "llama", "both"],
        default="both",
        help="the bench GPT, the small Llama, or both (default)",
    )
    p.add_argument(
        "--k", type=int, default=8, help="buckets fitted to the mixture workload (default 8)"
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda (bf16 autocast)")
    p.add_argument("--dim", type=int, default=128, help="model width (default 128)")
    p.add_argument("--json", default="", help="write the results here")
    a = p.parse_args()
    if a.dim < 4 or a.dim % 4:
        p.error(f"--dim must be a positive multiple of the 4 heads, got {a.dim}")
    if a.k < 1:
        p.error(f"--k must be at least 1, got {a.k}")
    if a.device.split(":")[0] not in ("cpu", "cuda"):
        p.error(f"--device must be cpu or cuda (cuda:N), got {a.device!r}")
    if a.json and (os.path.isdir(a.json) or not os.access(os.path.dirname(a.json) or ".", os.W_OK)):
        p.error(f"--json {a.json!r}: not a file this process can write")
    global DEVICE, DIM
    DEVICE, DIM = torch.device(a.device), a.dim
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    lengths = load_workload("mixture", n=200_000, max_len=256, seed=0)[0]
    buckets = list(fit_buckets(lengths, a.k, align=8, batching="bucketed", max_len=256))
    where = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "cpu"
    print(f"buckets {buckets}; torch {torch.__version__}; {os.cpu_count()} cpus; {where}")
    runs = [run(name, buckets) for name in (("gpt", "llama") if a.model == "both" else (a.model,))]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"buckets": buckets, "torch": torch.__version__, "device": where, "runs": runs},
                f,
                indent=1,
                default=str,
            )


if __name__ == "__main__":
    main()

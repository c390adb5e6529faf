"""``python -m shapebucket bench``: parse the options, run the harness, print and save."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from .harness import SAME_BATCHES, STRATEGIES, run
from .report import check_losses, format_table, plot

__all__ = ["main"]

_DESCRIPTION = """The steps/sec benchmark: every padding and compile strategy, side by side, in one process.

Trains the same small GPT from the same initialisation with each strategy for
the same number of steps, and reports steady-state steps/sec, useful (real)
tokens/sec, warm-up seconds, graphs compiled, recompiles in the timed phase,
token efficiency, peak memory and the final loss. Strategies 1-7 see the same
random batches in the same order, so their per-step losses must agree: the
run checks that and exits with status 1 when they do not."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shapebucket bench",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small smoke run (tiny model, few steps, k=3, strategies 1-8)",
    )
    p.add_argument("--workload", choices=["mixture", "text"], default="mixture")
    p.add_argument(
        "--lengths",
        metavar="FILE",
        help="your own lengths (one int per line, or .npy); overrides --workload",
    )
    p.add_argument(
        "--strategies",
        default=None,
        help="comma-separated subset of: "
        + ", ".join(STRATEGIES)
        + " (default: all; --quick: the first 8)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda (bf16 autocast; not tested by this project)",
    )
    p.add_argument(
        "--mode",
        default=None,
        choices=[None, "default", "reduce-overhead", "max-autotune"],
        help="torch.compile mode (GPU)",
    )
    p.add_argument(
        "--steps", type=int, default=None, help="timed steps per strategy (default 30, quick 6)"
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="untimed steps before timing (default 3, quick 2)",
    )
    p.add_argument("--batch-size", type=int, default=None, help="default 64, quick 16")
    p.add_argument(
        "--samples", type=int, default=200_000, help="samples drawn for the mixture workload"
    )
    p.add_argument("--k", type=int, default=None, help="fitted buckets (default 8, quick 3)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--dim", type=int, default=None, help="model width (default 128, quick 32)")
    p.add_argument("--layers", type=int, default=None, help="default 2, quick 1")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache",
        choices=["fresh", "shared"],
        default="fresh",
        help="fresh: an empty compile cache per strategy (honest warm-up); shared: reuse",
    )
    p.add_argument("--json", default="results/steps_per_sec.json", metavar="PATH")
    p.add_argument("--plot", default="results/steps_per_sec.png", metavar="PATH")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="do not fail when the losses of strategies 1-7 disagree",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quick = args.quick
    defaults = {
        "steps": (30, 6),
        "warmup_steps": (3, 2),
        "batch_size": (64, 16),
        "k": (8, 3),
        "dim": (128, 32),
        "layers": (2, 1),
    }
    for key, (full, small) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, small if quick else full)
    if quick and args.samples == 200_000:
        args.samples = 20_000
    if args.strategies is None:
        args.strategies = ",".join(STRATEGIES[:8] if quick else STRATEGIES)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in STRATEGIES]
    if unknown:
        print(
            f"error: unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}",
            file=sys.stderr,
        )
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    config, results = run(args)
    print()
    print(
        f"shapebucket steps/sec benchmark: workload {config['workload']} ({config['samples']:,} samples, mean length "
        f"{config['mean_length']:.1f}), batch {config['batch_size']}, {config['steps']} timed steps, model {config['model']}, "
        f"torch {config['torch']}, {config['device']}, {config['machine']}"
    )
    print(format_table(results))
    for path in (args.json, args.plot):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if args.json:
        payload = {"config": config, "results": [asdict(r) for r in results]}
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        plot(
            results,
            args.plot,
            f"{config['workload']}, batch {config['batch_size']}, torch {config['torch']}, {config['device']}",
        )
        print(f"wrote {args.plot}")
    status = 0
    for r in results:
        if r.name.startswith("shapebucket") and r.error is None and r.timed_recompiles:
            print(
                f"FAIL: {r.name} recompiled {r.timed_recompiles} times in its timed phase",
                file=sys.stderr,
            )
            status = 1
    problems = check_losses(results)
    if problems:
        print("FAIL: strategies that saw the same batches disagree on the loss:", file=sys.stderr)
        for line in problems:
            print("  " + line, file=sys.stderr)
        if not args.no_check:
            status = 1
    else:
        same = [r.name for r in results if r.name in SAME_BATCHES and r.error is None]
        if len(same) > 1:
            print(f"loss check: {', '.join(same)} agree at every step")
    return status

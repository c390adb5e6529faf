"""The steps/sec benchmark: every padding and compile strategy, side by side, in one process.

``python -m shapebucket bench`` (or ``python benchmarks/steps_per_sec.py``) trains
the same small GPT from the same initialisation with each strategy for the same
number of steps, and reports steady-state steps/sec, useful (real) tokens/sec,
warm-up seconds, graphs compiled, recompiles in the timed phase, token
efficiency, peak memory and the final loss. Strategies 1-7 see the same random
batches in the same order, so their per-step losses must agree: the script
checks that and exits with status 1 when they do not.

By default every strategy compiles into its own empty inductor cache
(``--cache fresh``), so warm-up seconds are each strategy's own cold cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import _torch_compat as compat
from ..buckets import Buckets
from ..collate import BucketCollator
from ..compile import CompileCounter, mark_dynamic, no_recompiles, prewarm
from ..fit import fit_buckets
from ..sampler import BucketBatchSampler
from .model import GPT, GPTConfig
from .workloads import load_workload

__all__ = ["STRATEGIES", "StrategyResult", "check_losses", "main", "run"]

STRATEGIES = (
    "eager-max",
    "eager-longest",
    "static-max",
    "compile-default",
    "mark-dynamic",
    "dynamic-true",
    "shapebucket-random",
    "shapebucket",
    "shapebucket-x32",
    "shapebucket-pow2",
)
SAME_BATCHES = STRATEGIES[:7]  # random batches in one order: their losses must agree
COMPILED_BASELINES = ("static-max", "compile-default", "mark-dynamic", "dynamic-true")


@dataclass
class StrategyResult:
    name: str
    steps_per_sec: float = 0.0
    useful_tokens_per_sec: float = 0.0
    warmup_s: float = 0.0
    graphs: int = 0
    timed_recompiles: int = 0
    recompile_limit_hit: bool = False
    token_efficiency: float = 0.0
    peak_mem_mb: float = 0.0
    final_loss: float = float("nan")
    buckets: list[int] | None = None
    losses: list[float] = field(default_factory=list)
    error: str | None = None


# -- memory -------------------------------------------------------------------------------


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: "5" resets the peak resident set size (VmHWM) of this process
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- data -----------------------------------------------------------------------------------


def _samples(
    lengths: np.ndarray, vocab: int, seed: int
) -> Callable[[Sequence[int] | np.ndarray], list[dict[str, torch.Tensor]]]:
    """Samples with random token ids, the same ids for an index in every strategy."""

    def get(indices: Sequence[int] | np.ndarray) -> list[dict[str, torch.Tensor]]:
        out = []
        for i in indices:
            g = torch.Generator().manual_seed(seed * 1_000_003 + int(i))
            ids = torch.randint(0, vocab, (int(lengths[i]),), generator=g)
            out.append({"input_ids": ids, "labels": torch.roll(ids, -1)})
        return out

    return get


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


# -- one strategy -----------------------------------------------------------------------------


@dataclass
class _Setup:
    cfg: GPTConfig
    lengths: np.ndarray
    batch_size: int
    steps: int
    warmup_steps: int
    k: int
    seed: int
    device: torch.device
    mode: str | None
    break_mask: str | None
    init_state: dict[str, torch.Tensor]
    random_batches: list[np.ndarray]
    get_samples: Callable[[Sequence[int] | np.ndarray], list[dict[str, torch.Tensor]]]


def _plan(name: str, s: _Setup) -> tuple[list[np.ndarray], BucketCollator, Buckets | None]:
    """The batches (index arrays), collator, and buckets to prewarm for strategy ``name``."""
    max_len, B, n = s.cfg.max_len, s.batch_size, s.warmup_steps + s.steps
    every_length = Buckets(range(2, max_len + 1))
    if name in ("eager-max", "static-max"):
        return s.random_batches[:n], BucketCollator(Buckets([max_len])), None
    if name in ("eager-longest", "mark-dynamic", "dynamic-true"):
        return s.random_batches[:n], BucketCollator(every_length), None
    if name == "compile-default":
        return s.random_batches[:n], BucketCollator(Buckets.multiples(8, max_len)), None
    if name == "shapebucket-random":
        buckets = fit_buckets(
            s.lengths, s.k, align=8, sampler="random", batch_size=B, max_len=max_len
        )
        return s.random_batches[:n], BucketCollator(buckets), buckets
    buckets = {
        "shapebucket": lambda: fit_buckets(
            s.lengths, s.k, align=8, sampler="bucketed", max_len=max_len
        ),
        "shapebucket-x32": lambda: Buckets.multiples(32, max_len),
        "shapebucket-pow2": lambda: Buckets.powers_of_two(max_len, min_len=8),
    }[name]()
    sampler = BucketBatchSampler(s.lengths, buckets, batch_size=B, seed=s.seed)
    batches: list[np.ndarray] = []
    for epoch in range(math.ceil(n / len(sampler))):
        sampler.set_epoch(epoch)
        batches.extend(np.asarray(b) for b in sampler)
    return batches[:n], BucketCollator(buckets, pad_batch_to=B), buckets


def _run_strategy(name: str, s: _Setup) -> StrategyResult:
    result = StrategyResult(name=name)
    index_batches, collate, buckets = _plan(name, s)
    if s.break_mask == name:  # deliberately wrong: pad tokens count in the loss and are attended to
        collate = BucketCollator(
            collate.buckets,
            pad_values={"labels": 0},
            mask_key=None,
            pad_batch_to=collate.pad_batch_to,
        )
    batches: list[dict[str, Any]] = []
    for idx in index_batches:
        b = collate(s.get_samples(idx))
        b.pop("sample_mask", None)
        if "attention_mask" not in b:
            b["attention_mask"] = torch.ones_like(b["input_ids"], dtype=torch.bool)
        batches.append(_to_device(b, s.device))
    real = [int(s.lengths[idx].sum()) for idx in index_batches]

    torch.manual_seed(s.seed)
    model = GPT(s.cfg).to(s.device)
    model.load_state_dict(s.init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compat.reset_compiler()
    if name.startswith("eager"):
        fwd: Any = model
    else:
        dynamic = {"compile-default": None, "dynamic-true": True}.get(name, False)
        fwd = torch.compile(model, dynamic=dynamic, fullgraph=True, mode=s.mode)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if s.device.type == "cuda" else None

    def step(batch: dict[str, Any]) -> torch.Tensor:
        if name == "mark-dynamic":
            # strict=False: with strict=True this model raises ConstraintViolationError on CPU
            # (inductor's kernels guard on 65 <= length), see docs/guide.md
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                mark_dynamic(batch, dim=1, strict=False)
        if autocast is not None:
            with autocast:
                loss = fwd(**batch)
        else:
            loss = fwd(**batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync() -> None:
        if s.device.type == "cuda":
            torch.cuda.synchronize(s.device)

    result.buckets = list(buckets) if buckets is not None else None
    _reset_peak_memory(s.device)
    losses: list[torch.Tensor] = []
    with CompileCounter() as total:
        t0 = time.perf_counter()
        if buckets is not None:
            prewarm(
                fwd,
                buckets,
                example=batches[0],
                collator=collate,
                batch_size=s.batch_size,
                step=step,
                optimizer=opt,
                progress=False,
            )
        for b in batches[: s.warmup_steps]:
            losses.append(step(b))
        sync()
        result.warmup_s = time.perf_counter() - t0
        with CompileCounter() as timed:
            guard = no_recompiles(buckets) if buckets is not None else contextlib.nullcontext()
            with guard:
                t1 = time.perf_counter()
                for b in batches[s.warmup_steps :]:
                    losses.append(step(b))
                sync()
                elapsed = time.perf_counter() - t1
    result.graphs = total.graphs
    result.timed_recompiles = timed.graphs
    result.recompile_limit_hit = bool(total.limit_hits)
    result.steps_per_sec = s.steps / elapsed
    timed_real = sum(real[s.warmup_steps :])
    timed_computed = sum(b["input_ids"].numel() for b in batches[s.warmup_steps :])
    result.useful_tokens_per_sec = timed_real / elapsed
    result.token_efficiency = timed_real / timed_computed
    result.peak_mem_mb = _peak_memory_mb(s.device)
    result.losses = [float(x) for x in torch.stack(losses).float().cpu()]
    result.final_loss = result.losses[-1]
    return result


# -- the run ---------------------------------------------------------------------------------------


def check_losses(
    results: Sequence[StrategyResult], rtol: float = 2e-3, atol: float = 2e-3
) -> list[str]:
    """Compare the per-step losses of the strategies that saw the same batches.

    Returns one line per disagreement (empty when all agree): padding with a
    correct mask must not change the math.
    """
    same = [r for r in results if r.name in SAME_BATCHES and r.error is None and r.losses]
    if len(same) < 2:
        return []
    ref = same[0]
    problems = []
    for r in same[1:]:
        a, b = np.asarray(ref.losses), np.asarray(r.losses)
        if a.shape != b.shape:
            problems.append(f"{r.name}: {len(b)} losses vs {len(a)} for {ref.name}")
            continue
        bad = np.flatnonzero(~np.isclose(b, a, rtol=rtol, atol=atol))
        if bad.size:
            i = int(bad[0])
            problems.append(
                f"{r.name}: step {i} loss {b[i]:.6f} vs {a[i]:.6f} for {ref.name} "
                f"({bad.size} of {len(a)} steps differ beyond rtol={rtol}, atol={atol})"
            )
    return problems


def _best_baseline(results: Sequence[StrategyResult]) -> StrategyResult | None:
    ok = [r for r in results if r.name in COMPILED_BASELINES and r.error is None]
    return max(ok, key=lambda r: r.useful_tokens_per_sec) if ok else None


def format_table(results: Sequence[StrategyResult]) -> str:
    best = _best_baseline(results)
    ranked = sorted(results, key=lambda r: -r.useful_tokens_per_sec if r.error is None else 0)
    head = (
        f"{'strategy':<19s} {'useful tok/s':>12s} {'vs best':>7s} {'steps/s':>8s} {'warmup s':>8s} "
        f"{'graphs':>6s} {'timed recompiles':>16s} {'limit hit':>9s} {'tok eff':>7s} {'peak MB':>8s} {'loss':>7s}"
    )
    lines = [head, "-" * len(head)]
    for r in ranked:
        if r.error is not None:
            lines.append(f"{r.name:<19s} failed: {r.error}")
            continue
        ratio = (
            f"{r.useful_tokens_per_sec / best.useful_tokens_per_sec:6.2f}x" if best else "    -  "
        )
        lines.append(
            f"{r.name:<19s} {r.useful_tokens_per_sec:>12,.0f} {ratio:>7s} {r.steps_per_sec:>8.2f} {r.warmup_s:>8.1f} "
            f"{r.graphs:>6d} {r.timed_recompiles:>16d} {'yes' if r.recompile_limit_hit else 'no':>9s} "
            f"{r.token_efficiency:>7.1%} {r.peak_mem_mb:>8.0f} {r.final_loss:>7.3f}"
        )
    if best is not None:
        lines.append(
            f"'vs best': useful tokens/sec relative to the best compiled strategy without shapebucket ({best.name})"
        )
    return "\n".join(lines)


def plot(results: Sequence[StrategyResult], path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.error is None]
    names = [r.name for r in ok]
    colors = [
        "#55a868"
        if n.startswith("shapebucket")
        else ("#4c72b0" if n in COMPILED_BASELINES else "#8c8c8c")
        for n in names
    ]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.barh(names, [r.useful_tokens_per_sec for r in ok], color=colors)
    a.set_xlabel("useful (real) tokens / s, higher is better")
    a.invert_yaxis()
    b.barh(names, [r.warmup_s for r in ok], color=colors)
    b.set_xlabel("warm-up seconds (compile + prewarm), lower is better")
    b.invert_yaxis()
    b.set_yticklabels([])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[StrategyResult]]:
    device = torch.device(args.device)
    cfg = GPTConfig(
        vocab=args.vocab, dim=args.dim, layers=args.layers, heads=args.heads, max_len=args.max_len
    )
    lengths, clipped = load_workload(
        args.workload,
        n=args.samples,
        max_len=args.max_len,
        seed=args.seed,
        lengths_file=args.lengths,
    )
    rng = np.random.default_rng(args.seed)
    n_steps = args.warmup_steps + args.steps
    perm = np.concatenate(
        [
            rng.permutation(len(lengths))
            for _ in range(math.ceil(n_steps * args.batch_size / len(lengths)))
        ]
    )
    random_batches = [perm[i * args.batch_size : (i + 1) * args.batch_size] for i in range(n_steps)]
    torch.manual_seed(args.seed)
    init_state = {k: v.clone() for k, v in GPT(cfg).state_dict().items()}
    setup = _Setup(
        cfg=cfg,
        lengths=lengths,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        k=args.k,
        seed=args.seed,
        device=device,
        mode=args.mode,
        break_mask=args.break_mask,
        init_state=init_state,
        random_batches=random_batches,
        get_samples=_samples(lengths, cfg.vocab, args.seed),
    )
    config = {
        "workload": args.workload if args.lengths is None else f"file:{args.lengths}",
        "samples": len(lengths),
        "clipped_to_max_len": clipped,
        "mean_length": float(lengths.mean()),
        "model": asdict(cfg),
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "k": args.k,
        "seed": args.seed,
        "device": str(device),
        "mode": args.mode,
        "cache": args.cache,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "threads": torch.get_num_threads(),
    }
    names = [n for n in STRATEGIES if n in args.strategies]
    results = []
    bar = _bar(names)
    for name in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(name)
        with tempfile.TemporaryDirectory(prefix="shapebucket-bench-") as tmp:
            cache = (
                compat.fresh_inductor_cache(tmp)
                if args.cache == "fresh"
                else contextlib.nullcontext()
            )
            try:
                with cache:
                    results.append(_run_strategy(name, setup))
            except Exception as e:  # one strategy failing must not hide the others
                results.append(
                    StrategyResult(
                        name=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    )
                )
    return config, results


def _bar(names: list[str]) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return names
    return tqdm(names, desc="strategies", unit="strategy", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shapebucket bench",
        description=__doc__,
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
    p.add_argument(
        "--break-mask", default=None, help=argparse.SUPPRESS
    )  # for the test that the check can fail
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

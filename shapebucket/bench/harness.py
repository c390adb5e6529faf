"""The benchmark harness: build each strategy's batches and model, time its steps.

Strategies 1-7 see the same random batches in the same order, so their per-step
losses must agree (:func:`shapebucket.bench.report.check_losses`). By default
every strategy compiles into its own empty inductor cache (``--cache fresh``)
after a compiler reset, so warm-up seconds are each strategy's own cold cost
and no strategy is served graphs another compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from .. import _torch_compat as compat
from .._progress import progress
from ..buckets import Buckets
from ..collate import BucketCollator
from ..fit import fit_buckets
from ..recompiles import CompileCounter, mark_dynamic, no_recompiles
from ..sampler import BucketBatchSampler
from ..warmup import prewarm
from .model import GPT, GPTConfig
from .workloads import load_workload

__all__ = ["COMPILED_BASELINES", "SAME_BATCHES", "STRATEGIES", "StrategyResult", "run"]

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
            s.lengths, s.k, align=8, batching="random", batch_size=B, max_len=max_len
        )
        return s.random_batches[:n], BucketCollator(buckets), buckets
    buckets = {
        "shapebucket": lambda: fit_buckets(
            s.lengths, s.k, align=8, batching="bucketed", max_len=max_len
        ),
        "shapebucket-x32": lambda: Buckets.multiples(32, max_len),
        "shapebucket-pow2": lambda: Buckets.powers_of_two(max_len, min_len=8),
    }[name]()
    sampler = BucketBatchSampler(s.lengths, buckets, batch_size=B, seed=s.seed)
    batches: list[np.ndarray] = []
    for epoch in range(math.ceil(n / len(sampler))):
        sampler.set_epoch(epoch)
        batches.extend(np.asarray(b) for b in sampler)
    return batches[:n], BucketCollator(buckets, batch_sizes=B), buckets


def _run_strategy(name: str, s: _Setup) -> StrategyResult:
    result = StrategyResult(name=name)
    index_batches, collate, buckets = _plan(name, s)
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
                batch_sizes=s.batch_size,
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
    bar = progress(names, desc="strategies", unit="strategy")
    for name in bar:
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



"""One strategy's run: its model and compiled step, its warm-up (:func:`prepare`), its timed
rounds (:func:`time_round`) and its summary (:func:`finish`)."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .. import _torch as compat
from .._torch import fresh_forward
from ..calibrate.memory import step_peak_bytes
from ..compile.marks import mark_dynamic
from ..compile.modes.run import CudaGraphs
from ..compile.prewarm import prewarm
from ..compile.recompiles import CompileCounter, no_recompiles
from ..plan.shapes import ShapePlan
from .batching import SEQUENCE_KEYS, Family, Setup
from .strategies import PEERS, STRATEGIES, StrategyResult

__all__ = [
    "Runner",
    "finish",
    "fresh_forward",
    "prepare",
    "time_round",
]


@dataclass
class Runner:
    """One strategy from its warm-up to its summary: its own copies of its family's
    batches, its compiled step, the guard of its timed rounds, its record and its losses."""

    name: str
    family: Family
    step: Callable[[dict[str, Any]], torch.Tensor]
    guard: Callable[[], Any]
    result: StrategyResult
    epoch_tokens: int  # real tokens of one epoch of the whole dataset
    losses: list[torch.Tensor] = field(default_factory=list)


def _maybe_mark(batch: dict[str, Any]) -> None:
    """``maybe_mark_dynamic`` on the length; strict=False: with strict=True this model raises
    ConstraintViolationError on CPU (inductor's kernels guard on 65 <= length), docs/guide.md."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mark_dynamic(batch, dim=1, sequence_keys=[*SEQUENCE_KEYS, "attention_mask"])


def _new_result(name: str, s: Setup, fam: Family) -> StrategyResult:
    """The strategy's record with what its family's batches say (shapes, efficiencies)."""
    result = StrategyResult(name=name, family=STRATEGIES[name].family, peer=name in PEERS)
    result.buckets = list(fam.buckets) if fam.buckets is not None else None
    result.epoch_steps = len(fam.epoch)
    padded = sum(rows * length for rows, length in fam.shapes)
    result.token_efficiency = float(s.lengths.sum()) / float(padded)
    result.shapes = len(set(fam.shapes))
    computed = sum(int(b["input_ids"].numel()) for b in fam.timed)
    result.timed_token_efficiency = sum(fam.timed_real) / computed
    return result


def prepare(name: str, s: Setup, fam: Family) -> Runner:
    """Build the model, compile, warm up (prewarm and/or the first steps); time it and
    record its graphs and peak memory."""
    strategy = STRATEGIES[name]
    result = _new_result(name, s, fam)
    fwd: Any = fresh_forward(name)
    mode = strategy.mode or s.args.mode
    if strategy.compile is not None:
        fwd = torch.compile(fwd, fullgraph=True, mode=mode, **strategy.compile)
    step, _, opt = s.training_step(fwd, _maybe_mark if strategy.maybe_mark else None)
    guard = (lambda: no_recompiles(fam.buckets)) if strategy.prewarm else contextlib.nullcontext
    # its own copies of the family's batches: marks (mark_dynamic) live on tensor objects,
    # and one strategy's marks must not change how another strategy's compiler sees them
    fam = replace(fam, warmup=[_copy(b) for b in fam.warmup], timed=[_copy(b) for b in fam.timed])
    runner = Runner(name, fam, step, guard, result, epoch_tokens=int(s.lengths.sum()))
    reset_peak_memory(s.device)
    with CompileCounter() as total:
        t0 = time.perf_counter()
        if strategy.prewarm and fam.buckets is not None:
            reserved = _reserved(s.device)
            prewarm(
                fwd,
                ShapePlan.of(fam.collate),  # the bench's collators pad rows: one shape per bucket
                fam.warmup[0],
                step=step,
                restore=[opt],
                # CUDA graphs are recorded after warm-up runs: record each shape's in prewarm
                modes=[CudaGraphs()] if mode == "reduce-overhead" else [],
                progress=False,
            )
            if mode == "reduce-overhead":  # what the recorded graphs keep
                result.graph_memory_mb = (_reserved(s.device) - reserved) / 2**20
        for i, b in enumerate(fam.warmup):
            runner.losses.append(step(b))
            if i == 0:
                sync(s.device)
                result.first_step_s = time.perf_counter() - t0
        sync(s.device)
        result.warmup_s = time.perf_counter() - t0
    result.graphs = total.graphs
    result.recompile_limit_hit = bool(total.limit_hits)
    result.warmup_peak_mem_mb = peak_memory_mb(s.device)
    result.warmup_steps = len(fam.warmup)
    result.warmup_epochs = sum(fam.warmup_real) / runner.epoch_tokens
    return runner


def _reserved(device: torch.device) -> int:
    """Bytes the CUDA caching allocator holds (0 off CUDA)."""
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def _copy(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def time_round(r: Runner, device: torch.device) -> None:
    """One timed epoch of the timed sample set, each step timed on its own; a step in which
    the compiler worked is kept out of the round's steady tokens/sec and counted in
    ``timed_compile_s`` (the whole job pays it once)."""
    fam, res = r.family, r.result
    compile_s = steady_s = 0.0
    steady_tokens = 0
    with CompileCounter() as cc, r.guard():
        for batch, real in zip(fam.timed, fam.timed_real, strict=True):
            graphs, events = compat.unique_graphs(), compat.compile_events()
            t0 = time.perf_counter()
            r.losses.append(r.step(batch))
            sync(device)
            dt = time.perf_counter() - t0
            if compat.unique_graphs() != graphs or compat.compile_events() != events:
                compile_s += dt
                res.compiled_steps.append(len(res.step_times))
            else:
                steady_s += dt
                steady_tokens += real
            res.step_times.append(dt)
    res.timed_recompiles += cc.graphs
    res.timed_compile_s += compile_s
    res.recompile_limit_hit |= bool(cc.limit_hits)
    if steady_s > 0:
        res.round_tokens_per_sec.append(steady_tokens / steady_s)
        res.round_epoch_s.append(r.epoch_tokens * steady_s / steady_tokens)


def finish(r: Runner, device: torch.device) -> None:
    """Fill the record's summary from its rounds: the median and min-max tokens/sec, the
    steady steps/sec, one epoch of the whole dataset (at each round's speed, the median
    kept), the whole job of one and of ten epochs, the per-step losses, and the peak
    memory of one step of its largest timed batch (measured after the rounds, untimed)."""
    res = r.result
    rounds = np.asarray(res.round_tokens_per_sec)
    res.useful_tokens_per_sec = float(np.median(rounds))
    res.tokens_per_sec_min, res.tokens_per_sec_max = float(rounds.min()), float(rounds.max())
    steps = len(r.family.timed)
    times = np.asarray(res.step_times).reshape(-1, steps)
    flags = np.zeros(times.size, dtype=bool)
    flags[res.compiled_steps] = True
    compiled = flags.reshape(times.shape)
    # steady state: the seconds per step of each round without its compiling steps
    per_step = [float(t[~c].mean()) for t, c in zip(times, compiled, strict=True) if (~c).any()]
    res.steps_per_sec = 1.0 / float(np.median(per_step))
    res.epoch_s = float(np.median(res.round_epoch_s))
    res.job_s, res.job10_s = res.job_seconds(1), res.job_seconds(10)
    res.losses = [float(x) for x in torch.stack(r.losses).float().cpu()]
    res.final_loss = res.losses[-1]
    heaviest = max(range(steps), key=lambda i: r.family.timed[i]["input_ids"].numel())
    with r.guard():
        res.peak_mem_mb = step_peak_bytes(lambda: r.step(r.family.timed[heaviest]), device) / 2**20


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's, or this process's resident set (Linux)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset the peak resident set size (VmHWM) of this process


def peak_memory_mb(device: torch.device) -> float:
    """The peak since :func:`reset_peak_memory`, in MiB (CPU: the process's VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

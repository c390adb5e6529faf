"""The benchmark's compile-while-training strategy: its warm-up trains.

:func:`prepare_background` starts :func:`~shapebucket.compile.compile_in_background`
on the strategy's model and trains eagerly on the timed sample set's batches (in
order, round after round) until every shape of the plan is compiled, loaded and
switched. That warm-up is timed like every other strategy's, but unlike a
prewarm it trains: the epochs of the whole dataset it trained (``warmup_epochs``)
are taken off the whole-job time, and where the warm-up alone trains a whole job
the job ends at the step that finished it (``warmup_curve``,
:meth:`~shapebucket.bench.strategies.StrategyResult.job_seconds`).
The background process is pinned to one core at nice 10, as the library does by default
(``--background-nice``);
the training process keeps torch's default thread count, so on a machine whose
cores training uses all of, the two share that core: the warm-up's eager steps
run slower than eager steps alone and the background compiles slower than a
prewarm (both are in the measured warm-up).

Its per-step losses are not compared with its family's (it trains more steps
before the timed rounds); ``tests/test_compile_background.py`` checks that the
losses of compile-while-training equal an eager run's.
"""

from __future__ import annotations

import time
import types
from typing import Any

import torch

from ..compile.background.handle import (
    BackgroundCompile,
    BackgroundOptions,
    compile_in_background,
)
from ..compile.recompiles import CompileCounter, no_recompiles
from ..plan.shapes import ShapePlan
from .batching import Family, Setup
from .memory import peak_memory_mb, reset_peak_memory, sync
from .runner import Runner, new_result
from .strategies import STRATEGIES

__all__ = ["prepare_background"]


def _by_frequency(fam: Family) -> Any:
    """What ``compile_in_background(sampler=)`` reads to order the shapes: the padded length
    of every epoch batch (most frequent compiles first)."""
    lengths = [length for _, length in fam.shapes]
    return types.SimpleNamespace(batch_buckets=lambda: lengths)


def prepare_background(name: str, s: Setup, fam: Family) -> Runner:
    """Warm up ``name`` by training eagerly while every shape compiles in the background;
    returns its :class:`~shapebucket.bench.runner.Runner` (timed rounds then run the
    switched, compiled shapes under ``no_recompiles``)."""
    result = new_result(name, s, fam)
    strategy = STRATEGIES[name]
    a = s.args
    if s.device.type != "cpu":
        raise RuntimeError(f"{name} runs on CPU only in this benchmark (no autocast step)")
    if fam.buckets is None:
        raise RuntimeError(f"{name} needs a family with fixed shapes")
    torch.manual_seed(a.seed)
    model = s.make_model()
    model.load_state_dict(s.init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plan = ShapePlan.of(fam.collate)
    options = {"fullgraph": True, "mode": a.mode, **(strategy.compile or {})}
    options.pop("dynamic", None)

    def step(batch: dict[str, Any]) -> torch.Tensor:
        loss = model(**batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    runner = Runner(
        name,
        fam,
        step,
        lambda: no_recompiles(plan),
        result,
        epoch_tokens=int(s.lengths.sum()),
    )
    reset_peak_memory(s.device)
    with CompileCounter() as total:
        t0 = time.perf_counter()
        bg = compile_in_background(
            s.make_model,
            plan,
            fam.warmup[0],
            model=model,
            sampler=_by_frequency(fam),
            options=BackgroundOptions(compile_options=options, nice=a.background_nice),
        )
        with bg:
            losses, tokens, steps = _train_until_switched(bg, runner, len(plan), t0)
            sync(s.device)
        result.warmup_s = time.perf_counter() - t0
    runner.losses.extend(torch.tensor(losses).unbind())
    result.warmup_epochs = tokens / runner.epoch_tokens
    result.warmup_steps = steps
    result.graphs = total.graphs
    result.recompile_limit_hit = bool(total.limit_hits)
    result.warmup_peak_mem_mb = peak_memory_mb(s.device)
    result.background = bg.report.to_dict()
    return runner


def _train_until_switched(
    bg: BackgroundCompile, runner: Runner, shapes: int, t0: float
) -> tuple[list[float], int, int]:
    """Eager steps on the timed batches, round after round, each on the warm-up curve, until
    ``shapes`` shapes are switched; returns the losses, the real tokens and the steps."""
    fam, result = runner.family, runner.result
    # the warm-up's losses as floats: a loss tensor kept per step is a small native
    # allocation between the step's freed activations, which then fragments the heap
    # (the process grew by about 1 MB a step, 20 GB over a long warm-up)
    losses: list[float] = []
    tokens = 0
    i, passes_after_done = 0, 0
    while len(bg.report.switched_at) < shapes and passes_after_done < 2:
        j = i % len(fam.timed)
        losses.append(float(runner.step(fam.timed[j])))
        tokens += fam.timed_real[j]
        now = time.perf_counter() - t0
        result.warmup_curve.append([now, tokens / runner.epoch_tokens])
        if i == 0:
            result.first_step_s = now
        if bg.report.error is not None:
            raise RuntimeError(f"the background compile failed: {bg.report.error}")
        i += 1
        if bg.done and j == len(fam.timed) - 1:
            passes_after_done += 1  # a shape the timed set never has stays unswitched
    return losses, tokens, i

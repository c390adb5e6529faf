"""The benchmark harness: each strategy's batches, model and warm-up, then interleaved timing.

How the figures are made to hold on a shared, noisy machine:

* **Own code object per strategy.** Dynamo caches graphs per code object, and two
  compiled instances of one model class share it (and its recompile limit). Each
  strategy compiles its own copy of a two-line forward function
  (:func:`fresh_forward`), so no strategy is ever served another's graphs.
* **Own cold compile.** With ``--cache fresh`` (default) each strategy compiles
  into its own empty inductor cache, so its warm-up is its own cold cost.
* **Interleaved rounds.** Every strategy is warmed up first; then the timed
  rounds run A B C ... A B C ..., each round every strategy's same timed
  batches. Per strategy the report gives the median round and the min-max of
  the rounds; two strategies whose ranges overlap are within noise.
* **Representative batches.** The timed batches are a systematic sample of one
  whole epoch of that strategy's own batches, sorted by padded length, so every
  bucket (or batch length) appears in proportion to the epoch.
* **The whole job.** A user pays the warm-up once per run: ``job_s`` is the
  time to train one epoch, warm-up and compiles seen while timed included,
  from the epoch's step count and the median round's seconds per step.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .. import _torch_compat as compat
from .._progress import progress
from .._validate import round_up
from ..compile.modes import CudaGraphs
from ..compile.prewarm import prewarm
from ..compile.recompiles import CompileCounter, mark_dynamic, no_recompiles
from ..plan.buckets import Buckets
from ..plan.fit import fit_buckets
from ..plan.shapes import ShapePlan
from .model import GPT, CaptionConfig, Captioner, GPTConfig
from .plans import SEQUENCE_KEYS, Family, Setup, build_family, make_samples, plan_family
from .workloads import load_workload

__all__ = [
    "PEERS",
    "STRATEGIES",
    "Strategy",
    "StrategyResult",
    "check_padding_invariance",
    "fresh_forward",
    "run",
]


@dataclass(frozen=True)
class Strategy:
    """How one strategy forms, pads and compiles its batches.

    ``family`` names the batch plan: strategies of one family see the same
    batches in the same order, so their per-step losses must agree.
    """

    family: str  # "grouped", "buckets", "tokens" or "packed"
    compile: dict[str, Any] | None  # torch.compile kwargs; None runs eagerly
    mark: str | None = None  # "maybe" (maybe_mark_dynamic) or "specialize" (specialize_on)
    prewarm: bool = False
    about: str = ""


STRATEGIES: dict[str, Strategy] = {
    "grouped-eager": Strategy(
        "grouped", None, about="length-grouped batches, pad to longest x8, eager"
    ),
    "grouped-compile": Strategy(
        "grouped", {"dynamic": None}, about="same batches, torch.compile default (dynamic=None)"
    ),
    "grouped-mark-dynamic": Strategy(
        "grouped",
        {"dynamic": False},
        mark="maybe",
        about="same batches, dynamic=False + maybe_mark_dynamic on the length",
    ),
    "grouped-dynamic": Strategy("grouped", {"dynamic": True}, about="same batches, dynamic=True"),
    "shapebucket": Strategy(
        "buckets",
        {"dynamic": False},
        prewarm=True,
        about="fitted buckets, BucketBatchSampler, rows rows, prewarmed, dynamic=False",
    ),
    "shapebucket-specialized": Strategy(
        "buckets",
        {"dynamic": False},
        mark="specialize",
        prewarm=True,
        about="same batches, mark_dynamic(specialize_on=one predicate per bucket)",
    ),
    "shapebucket-tokens": Strategy(
        "tokens",
        {"dynamic": False},
        prewarm=True,
        about="fitted buckets, BucketBatchSampler(tokens_per_batch=...), prewarmed",
    ),
    "shapebucket-packed-eager": Strategy(
        "packed",
        None,
        about="same packed batches, eager (nothing to compile)",
    ),
    "shapebucket-packed": Strategy(
        "packed",
        {"dynamic": False},
        prewarm=True,
        about="fit_packing row lengths, PackedBatchSampler(tokens_per_batch=...), "
        "PackedCollator, document mask, prewarmed",
    ),
}
PEERS = tuple(n for n in STRATEGIES if not n.startswith("shapebucket"))


@dataclass
class StrategyResult:
    name: str
    family: str = ""
    peer: bool = False
    warmup_s: float = 0.0
    graphs: int = 0
    timed_recompiles: int = 0
    timed_compile_s: float = 0.0
    recompile_limit_hit: bool = False
    round_tokens_per_sec: list[float] = field(default_factory=list)
    useful_tokens_per_sec: float = 0.0  # median round
    tokens_per_sec_min: float = 0.0
    tokens_per_sec_max: float = 0.0
    steps_per_sec: float = 0.0  # median round
    token_efficiency: float = 0.0  # over the whole epoch's plan
    epoch_steps: int = 0
    job_s: float = 0.0  # one epoch, warm-up included
    warmup_peak_mem_mb: float = 0.0
    final_loss: float = float("nan")
    buckets: list[int] | None = None
    shapes: int = 0  # distinct batch shapes in the epoch
    step_times: list[float] = field(default_factory=list)
    compiled_steps: list[int] = field(default_factory=list)  # indices into step_times
    losses: list[float] = field(default_factory=list)
    error: str | None = None


def fresh_forward(tag: str) -> Callable[[Any, dict[str, Any]], Any]:
    """``forward(model, batch) = model(**batch)`` with a code object of its own.

    Dynamo keys its graph cache and its recompile limit on the code object, so
    compiling this function once per strategy keeps each strategy's graphs (and
    its recompile count) to itself, with no compiler reset between them.

    >>> a, b = fresh_forward("a"), fresh_forward("b")
    >>> a.__code__ is b.__code__, a(lambda x: x + 1, {"x": 1})
    (False, 2)
    """

    def forward(model: Any, batch: dict[str, Any]) -> Any:
        return model(**batch)

    name = "forward_" + "".join(c if c.isalnum() else "_" for c in tag)
    code = forward.__code__.replace(co_name=name)  # a new code object, its own cache
    return types.FunctionType(code, forward.__globals__, name)


# -- memory ---------------------------------------------------------------------------


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset the peak resident set size (VmHWM) of this process


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- one strategy ---------------------------------------------------------------------------


@dataclass
class _Runner:
    name: str
    family: Family
    step: Callable[[dict[str, Any]], torch.Tensor]
    guard: Callable[[], Any]
    result: StrategyResult
    losses: list[torch.Tensor] = field(default_factory=list)


def _marker(strategy: Strategy, buckets: Buckets | None) -> Callable[[dict[str, Any]], None] | None:
    if strategy.mark == "maybe":

        def maybe(batch: dict[str, Any]) -> None:
            # strict=False: with strict=True this model raises ConstraintViolationError on CPU
            # (inductor's kernels guard on 65 <= length), see docs/guide.md
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                mark_dynamic(batch, dim=1, sequence_keys=[*SEQUENCE_KEYS, "attention_mask"])

        return maybe
    if strategy.mark == "specialize":
        sizes = list(buckets or [])

        def specialize(batch: dict[str, Any]) -> None:
            # specialize_on on one tensor (torch builds no cross product of specialisations);
            # the others share its length symbol through plain mark_dynamic
            compat.mark_dynamic_specialized(batch["input_ids"], 1, sizes)
            for key in ("labels", "attention_mask"):
                compat.mark_dynamic_dim(batch[key], 1, strict=True, min=None, max=None)

        return specialize
    return None


def _prepare(name: str, s: Setup, fam: Family) -> _Runner:
    """Build the model, compile, warm up (prewarm and/or the first steps); time it."""
    strategy = STRATEGIES[name]
    a = s.args
    result = StrategyResult(name=name, family=strategy.family, peer=name in PEERS)
    result.buckets = list(fam.buckets) if fam.buckets is not None else None
    result.epoch_steps = len(fam.epoch)
    result.token_efficiency = float(s.lengths.sum()) / float(sum(fam.padded))
    result.shapes = len(set(fam.shapes))
    torch.manual_seed(a.seed)
    model = s.make_model().to(s.device)
    model.load_state_dict(s.init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd: Any = fresh_forward(name)
    if strategy.compile is not None:
        fwd = torch.compile(fwd, fullgraph=True, mode=a.mode, **strategy.compile)
    mark = _marker(strategy, fam.buckets)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if s.device.type == "cuda"
        else contextlib.nullcontext()
    )

    def step(batch: dict[str, Any]) -> torch.Tensor:
        if mark is not None:
            mark(batch)
        with autocast:
            loss = fwd(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    guard = (lambda: no_recompiles(fam.buckets)) if strategy.prewarm else contextlib.nullcontext
    # its own copies of the family's batches: marks (mark_dynamic) live on tensor objects,
    # and one strategy's marks must not change how another strategy's compiler sees them
    fam = replace(fam, warmup=[_copy(b) for b in fam.warmup], timed=[_copy(b) for b in fam.timed])
    runner = _Runner(name, fam, step, guard, result)
    _reset_peak_memory(s.device)
    with CompileCounter() as total:
        t0 = time.perf_counter()
        if strategy.prewarm and fam.buckets is not None:
            prewarm(
                fwd,
                ShapePlan.of(fam.collate),  # the bench's collators pad rows: one shape per bucket
                fam.warmup[0],
                step=step,
                restore=[opt],
                # CUDA graphs are recorded after warm-up runs: record each shape's in prewarm
                modes=[CudaGraphs()] if a.mode == "reduce-overhead" else [],
                progress=False,
            )
        runner.losses.extend(step(b) for b in fam.warmup)
        _sync(s.device)
        result.warmup_s = time.perf_counter() - t0
    result.graphs = total.graphs
    result.recompile_limit_hit = bool(total.limit_hits)
    result.warmup_peak_mem_mb = _peak_memory_mb(s.device)
    return runner


def _copy(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_round(r: _Runner, device: torch.device) -> None:
    """One timed pass over the strategy's timed batches, each step timed on its own.

    A step that compiled a graph is kept out of the round's tokens/sec (the steady
    state) and counted in ``timed_compile_s`` instead, which the whole-job time
    includes: a compile is paid once per run, not once per round."""
    fam, res = r.family, r.result
    compile_s = steady_s = 0.0
    steady_tokens = 0
    with CompileCounter() as cc, r.guard():
        for batch, real in zip(fam.timed, fam.timed_real, strict=True):
            graphs = compat.unique_graphs()
            t0 = time.perf_counter()
            r.losses.append(r.step(batch))
            _sync(device)
            dt = time.perf_counter() - t0
            if compat.unique_graphs() != graphs:
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


def _finish(r: _Runner) -> None:
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
    median_step = float(np.median(per_step))
    res.steps_per_sec = 1.0 / median_step
    # a step that compiled counts its compile in the job, not in the steady state
    res.job_s = res.warmup_s + res.timed_compile_s + res.epoch_steps * median_step
    res.losses = [float(x) for x in torch.stack(r.losses).float().cpu()]
    res.final_loss = res.losses[-1]


# -- correctness --------------------------------------------------------------------------------


def check_padding_invariance(
    s: Setup, families: dict[str, Family] | None = None, batches: int = 3
) -> list[str]:
    """The same samples padded two ways, to their bucket (shapebucket's collator) and to the
    longest rounded to 8 (the peers' collator), must give the same loss: the masks keep
    padding out of the math. Eager, from the initial weights, on the first batches of the
    bucket sampler's epoch. Plans already built for the run (``families``) are reused.
    Returns one line per disagreement (empty when all agree)."""
    built = families or {}
    bucketed = built.get("buckets") or plan_family("buckets", s)
    grouped = built.get("grouped") or plan_family("grouped", s)
    model = s.make_model().to(s.device)
    model.load_state_dict(s.init_state)
    problems = []

    def loss_of(fam: Family, samples: list[dict[str, torch.Tensor]]) -> float:
        b: dict[str, Any] = dict(fam.collate(samples))  # type: ignore[arg-type]
        b.pop("sample_mask", None)
        if "attention_mask" not in b and "document_ids" not in b:
            b["attention_mask"] = torch.ones_like(b["input_ids"], dtype=torch.bool)
        return float(model(**{k: v.to(s.device) for k, v in b.items()}))

    with torch.no_grad():
        for i, idx in enumerate(bucketed.epoch[:batches]):
            samples = s.get_samples(idx.tolist())
            ours, theirs = loss_of(bucketed, samples), loss_of(grouped, samples)
            if not math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-5):
                problems.append(
                    f"batch {i}: loss {ours:.6f} padded to its bucket vs {theirs:.6f} padded to "
                    "the longest: padding leaks into the loss (a mask is wrong)"
                )
        packed = built.get("packed")
        for i, idx in enumerate(packed.epoch[:batches] if packed is not None else []):
            samples = s.get_samples(idx.tolist())
            ours = loss_of(packed, samples)  # type: ignore[arg-type]  # not None when looping
            theirs = loss_of(grouped, samples)
            if not math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-5):
                problems.append(
                    f"packed batch {i}: loss {ours:.6f} packed vs {theirs:.6f} one sample per "
                    "row: attention crosses samples (the document mask is wrong)"
                )
    return problems


# -- the run ---------------------------------------------------------------------------------------


def _setup(args: argparse.Namespace) -> Setup:
    device = torch.device(args.device)
    lengths, clipped = load_workload(
        args.workload,
        n=args.samples,
        max_len=args.max_len,
        seed=args.seed,
        lengths_file=args.lengths,
    )
    if args.packed_tokens_per_batch is None:
        # packing's budget: the real tokens of an average batch of --batch-size samples,
        # rounded up to whole rows of the longest row length
        longest = round_up(int(lengths.max()), 8)
        args.packed_tokens_per_batch = round_up(
            math.ceil(args.batch_size * float(lengths.mean())), longest
        )
    image: tuple[int, ...] | None = None
    make_model: Callable[[], torch.nn.Module]
    cfg: GPTConfig
    dims = {
        "vocab": args.vocab,
        "dim": args.dim,
        "layers": args.layers,
        "heads": args.heads,
        "max_len": args.max_len,
    }
    if args.workload == "captioning":
        ccfg = CaptionConfig(**dims)
        image, cfg = (ccfg.channels, ccfg.image, ccfg.image), ccfg
        make_model = lambda: Captioner(ccfg)  # noqa: E731
    else:
        gcfg = GPTConfig(**dims)
        cfg = gcfg
        make_model = lambda: GPT(gcfg)  # noqa: E731
    torch.manual_seed(args.seed)
    init_state = {k: v.clone() for k, v in make_model().state_dict().items()}
    buckets = fit_buckets(lengths, args.k, align=8, batching="bucketed", max_len=args.max_len)
    return Setup(
        args=args,
        lengths=lengths,
        clipped=clipped,
        model_config=asdict(cfg),
        device=device,
        make_model=make_model,
        init_state=init_state,
        buckets=buckets,
        get_samples=make_samples(lengths, cfg.vocab, args.seed, image),
    )


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[StrategyResult], list[str]]:
    """Warm every strategy up (each its own cold compile), then time them in interleaved rounds.

    Returns the run's configuration, one result per strategy (in ``args.strategies``
    order) and the padding-invariance problems (empty when the masks are right).
    """
    s = _setup(args)
    names = [n for n in STRATEGIES if n in args.strategies]
    skipped: dict[str, str] = {}
    families: dict[str, Family] = {}
    for f in sorted({STRATEGIES[n].family for n in names}):
        try:
            families[f] = build_family(f, s)
        except RuntimeError as e:  # a family this workload cannot run (reported per strategy)
            skipped[f] = str(e)
    problems = check_padding_invariance(s, families)
    results: dict[str, StrategyResult] = {}
    for name in names:
        if STRATEGIES[name].family in skipped:
            results[name] = StrategyResult(
                name=name,
                family=STRATEGIES[name].family,
                peer=name in PEERS,
                error=skipped[STRATEGIES[name].family],
            )
    names_run = [n for n in names if n not in results]
    runners: list[_Runner] = []
    with contextlib.ExitStack() as keep:  # compiled kernels live in these dirs until the end
        for name in progress(names_run, desc="warm-up", unit="strategy"):
            cache: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
            if args.cache == "fresh":
                tmp = keep.enter_context(tempfile.TemporaryDirectory(prefix="shapebucket-bench-"))
                cache = compat.fresh_inductor_cache(tmp)
            try:
                with cache:
                    runners.append(_prepare(name, s, families[STRATEGIES[name].family]))
            except Exception as e:  # one strategy failing must not hide the others
                results[name] = StrategyResult(
                    name=name,
                    family=STRATEGIES[name].family,
                    peer=name in PEERS,
                    error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}",
                )
        for r in progress(list(range(args.rounds)), desc="timed rounds", unit="round"):
            # rotate the order each round, so no strategy always runs right after another
            for runner in (
                runners[r % len(runners) :] + runners[: r % len(runners)] if runners else []
            ):
                if runner.result.error is not None:
                    continue
                try:
                    _time_round(runner, s.device)
                except Exception as e:
                    runner.result.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        for runner in runners:
            if runner.result.error is None:
                _finish(runner)
            results[runner.name] = runner.result
    config = {
        "workload": args.workload if args.lengths is None else f"file:{args.lengths}",
        "samples": len(s.lengths),
        "clipped_to_max_len": s.clipped,
        "mean_length": float(s.lengths.mean()),
        "epoch_real_tokens": int(s.lengths.sum()),
        "model": s.model_config,
        "buckets": list(s.buckets),
        "batch_size": args.batch_size,
        "bucket_tokens_per_batch": args.bucket_tokens_per_batch,
        "packed_tokens_per_batch": args.packed_tokens_per_batch,
        "packing": None
        if "packed" not in families or families["packed"].packing is None
        else {
            "buckets": list(families["packed"].packing.buckets),
            "rows": {str(k): v for k, v in families["packed"].packing.rows.items()},
            "token_efficiency": families["packed"].packing.report.token_efficiency,
            "attention_efficiency": families["packed"].packing.report.attention_efficiency,
        },
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "warmup_steps": args.warmup_steps,
        "k": args.k,
        "seed": args.seed,
        "device": str(s.device)
        if s.device.type != "cuda"
        else torch.cuda.get_device_name(s.device),
        "mode": args.mode,
        "cache": args.cache,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "threads": torch.get_num_threads(),
        "strategies": {n: STRATEGIES[n].about for n in names},
    }
    return config, [results[n] for n in names], problems

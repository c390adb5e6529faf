"""The benchmark run: its setup, every strategy warmed up (each in its own empty compile
cache, with its own code object), then interleaved timed rounds of whole epochs of the same
samples, and the padding-invariance check (docs/benchmarks.md says why each)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from .. import _torch as compat
from .._progress import progress
from ..errors import ShapeBucketError
from ..fit.optimal import fit_buckets
from .batching import Family, Setup, build_family, epoch_batches, make_samples, timed_sample_set
from .limit import add_limit, limit_runners
from .model import GPT, CaptionConfig, Captioner, GPTConfig
from .peers import source as grouped_source
from .profiles import profile_config
from .runner import Runner, finish, prepare, time_round
from .strategies import PEERS, STRATEGIES, StrategyResult

__all__ = ["check_padding_invariance", "run"]


def check_padding_invariance(s: Setup, families: dict[str, Family] | None = None) -> list[str]:
    """The same samples padded to their bucket (or packed) and padded to the longest rounded
    to 8 (the peers' collator) must give the same loss. Eager, from the initial weights, on
    each family's first 3 batches; ``families`` already built are reused (the bucket family
    is built when missing). Returns one line per disagreement (empty when all agree)."""
    built = dict(families or {})
    grouped = built.get("grouped") or epoch_batches("grouped", s)
    checked = {"buckets": built.get("buckets") or epoch_batches("buckets", s)}
    checked |= {name: built[name] for name in ("packed", "fixed") if name in built}
    model = s.training_step()[1]
    problems = []

    def loss_of(fam: Family, samples: list[dict[str, torch.Tensor]], i: int = 0) -> float:
        b = fam.collate_batch(samples, i)
        if "attention_mask" not in b and "document_ids" not in b:
            b["attention_mask"] = torch.ones_like(b["input_ids"], dtype=torch.bool)
        return float(model(**{k: v.to(s.device) for k, v in b.items()}))

    with torch.no_grad():
        for name, fam in checked.items():
            how, why = (
                ("padded to its bucket", "padding leaks into the loss (a mask is wrong)")
                if name == "buckets"
                else ("packed", "attention crosses samples (the document mask is wrong)")
            )
            for i, idx in enumerate(fam.epoch[:3]):
                samples = s.get_samples(idx.tolist())
                ours, theirs = loss_of(fam, samples, i), loss_of(grouped, samples)
                if not math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-5):
                    problems.append(
                        f"{name} batch {i}: loss {ours:.6f} {how} vs {theirs:.6f} padded to "
                        f"the longest, one sample per row: {why}"
                    )
    return problems


# -- the run ---------------------------------------------------------------------------------------


def _setup(args: argparse.Namespace) -> Setup:
    device = torch.device(args.device)
    lengths, clipped = args.workload_lengths  # loaded once, by the command line's checks
    dims = dict(
        vocab=args.vocab,
        dim=args.model_dim,
        layers=args.depth,
        heads=args.heads,
        max_len=args.max_len,
    )
    cfg: GPTConfig
    image: tuple[int, ...] | None = None
    if args.workload == "captioning":
        cfg = caption = CaptionConfig(**dims)
        image = (caption.channels, caption.image, caption.image)
        make_model: Callable[[], torch.nn.Module] = functools.partial(Captioner, caption)
    else:
        cfg = GPTConfig(**dims)
        make_model = functools.partial(GPT, cfg)
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
        timed_ids=timed_sample_set(len(lengths), args.epoch_samples, args.seed),
    )


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[StrategyResult], list[str]]:
    """Warm every strategy up (each its own cold compile), then time them in interleaved
    rounds. Returns the run's configuration, one result per strategy (in ``args.strategies``
    order) and the padding-invariance problems (empty when the masks are right)."""
    s = _setup(args)
    names = [n for n in STRATEGIES if n in args.strategies]
    families, skipped = _build_families(s, names)
    problems = check_padding_invariance(s, families)
    results: dict[str, StrategyResult] = {}
    for name in names:
        if STRATEGIES[name].family in skipped:
            results[name] = _failed(name, skipped[STRATEGIES[name].family])
    names_run = [n for n in names if n not in results]
    with contextlib.ExitStack() as keep:  # compiled kernels live in these dirs until the end
        runners = _warm_up(names_run, s, families, results, keep)
        limits = [] if args.no_limit else limit_runners(s)  # same rounds
        _timed_rounds([*runners, *limits], s.device, args.rounds)
        for runner in runners:
            if runner.result.error is None:
                finish(runner, s.device)
            results[runner.name] = runner.result
    rows = [results[n] for n in names]
    if not args.no_limit:
        add_limit(s, families, rows, limits)  # the reference row, last
    return _config(args, s, families, names), rows, problems


def _build_families(s: Setup, names: list[str]) -> tuple[dict[str, Family], dict[str, str]]:
    """The batches of each family the strategies use, and the error of each family
    this workload cannot run."""
    skipped: dict[str, str] = {}
    families: dict[str, Family] = {}
    for f in sorted({STRATEGIES[n].family for n in names}):
        try:
            families[f] = build_family(f, s)
        except (RuntimeError, ShapeBucketError) as e:  # this run cannot build it (e.g. the
            # calibration refused a length): reported per strategy, the others still run
            skipped[f] = str(e)
    return families, skipped


def _failed(name: str, error: str) -> StrategyResult:
    strategy = STRATEGIES[name]
    return StrategyResult(name=name, family=strategy.family, peer=name in PEERS, error=error)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def _warm_up(
    names: list[str],
    s: Setup,
    families: dict[str, Family],
    results: dict[str, StrategyResult],
    keep: contextlib.ExitStack,
) -> list[Runner]:
    """Prepare each strategy (with ``--cache fresh`` in its own empty inductor cache, whose
    directory ``keep`` holds until the run ends). A strategy that fails gets its error in
    ``results``; the others go on."""
    runners: list[Runner] = []
    for name in progress(names, desc="warm-up", unit="strategy"):
        cache: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if s.args.cache == "fresh":
            tmp = keep.enter_context(tempfile.TemporaryDirectory(prefix="shapebucket-bench-"))
            cache = compat.fresh_inductor_cache(tmp)
        try:
            with cache:
                runners.append(prepare(name, s, families[STRATEGIES[name].family]))
        except Exception as e:  # one strategy failing must not hide the others
            results[name] = _failed(name, _error(e))
    return runners


def _timed_rounds(runners: list[Runner], device: torch.device, rounds: int) -> None:
    """``rounds`` timed rounds over every strategy; a strategy that fails keeps its error
    and sits out the rounds after."""
    for r in progress(list(range(rounds)), desc="timed rounds", unit="round"):
        # rotate the order each round, so no strategy always runs right after another
        for runner in runners[r % len(runners) :] + runners[: r % len(runners)] if runners else []:
            if runner.result.error is not None:
                continue
            try:
                time_round(runner, device)
            except Exception as e:
                runner.result.error = _error(e)


def _config(
    args: argparse.Namespace, s: Setup, families: dict[str, Family], names: list[str]
) -> dict[str, Any]:
    """The run's configuration, as the JSON output records it."""
    packing = s.packing
    return {
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
        if packing is None
        else {
            "buckets": list(packing.buckets),
            "rows": {str(k): v for k, v in packing.rows.items()},
            "token_efficiency": packing.report.token_efficiency,
            "attention_efficiency": packing.report.attention_efficiency,
        },
        "calibrated": None
        if s.calibrated is None
        else {
            "rows": {str(k): v for k, v in s.calibrated.rows.items()},
            "peak_bytes": {str(k): v for k, v in s.calibrated.peak.items()},
            "budget_bytes": s.calibrated.budget,
            "seconds": s.calibrated.seconds,
            "measured": s.calibrated.measured,
        },
        "rounds": args.rounds,
        "timed_samples": len(s.timed_ids),
        "timed_real_tokens": int(s.lengths[s.timed_ids].sum()),
        "fixed_packer": args.fixed_packer,
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
        "grouped_sampler": grouped_source(),
        "profile": profile_config(args),
        "tokens_per_step": args.tokens_per_step,
        "attention": args.attention,
    }

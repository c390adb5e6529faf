"""``python -m shapebucket bench``: parse the options, run the harness, print and save."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._argparse import MAX_DRAWN, Parser, output_path, plot_formats
from .._lengths import round_up
from .._validate import check_int
from ..errors import ShapeBucketError
from .flags import add_flags
from .harness import run
from .profiles import apply_profile, describe_profile, fill_defaults
from .report import check_losses, format_table, headline, plot, run_payload
from .strategies import DEFAULT, PEERS, STRATEGIES, StrategyResult, for_device
from .workloads import load_workload

__all__ = ["main"]

_DESCRIPTION = """The steps/sec benchmark: shapebucket against what users would do instead.

Trains the same small model from the same initialisation with each strategy, in
interleaved timed rounds of one whole epoch of the same samples (--epoch-samples), and
reports useful (real) tokens/sec, peak memory, warm-up, the whole job and the compiles.
The peers are transformers' length-grouped batches (eager, dynamic=None, mark_dynamic,
dynamic=True) and fixed-length packing (TRL's bfd or torchtune's next-fit), eager and
compiled. Strategies of one family must agree on the loss, and padding must not change
it: the run exits with status 1 otherwise. docs/benchmarks.md explains every column."""

# (full run, --quick)
_DEFAULTS = {
    "rounds": (5, 2),
    "epoch_samples": (6_000, 400),
    "warmup_steps": (3, 1),
    "batch_size": (64, 16),
    "samples": (200_000, 20_000),
    "k": (8, 2),
    "model_dim": (128, 32),
    "depth": (2, 1),
}


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m shapebucket bench",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p)
    return p


def _replay(args: argparse.Namespace) -> int:
    """The table, headline and plot of a saved run, as measured then."""
    if not args.from_json:
        raise ShapeBucketError("--from-json needs the path of a saved run (a .json it wrote)")
    try:
        data = json.loads(Path(args.from_json).read_text())
        entries = data["results"]
        if not isinstance(entries, list) or not entries:
            raise ShapeBucketError(
                f"{args.from_json} is not a saved benchmark run: its results are "
                f"{'an empty list' if entries == [] else 'a ' + type(entries).__name__}, not a "
                "list of the strategies' results"
            )
        results = [StrategyResult.from_saved(r, f"results[{i}]") for i, r in enumerate(entries)]
        names = [r.name for r in results]
        if len(set(names)) < len(names):
            raise ShapeBucketError(f"{args.from_json} lists a strategy twice: {names}")
        old = [r.name for r in results if r.error is None and not r.round_epoch_s]
        if old:
            raise ShapeBucketError(
                f"{args.from_json} was written by an earlier version of the benchmark "
                f"(no whole-epoch rounds for {', '.join(old)}); it cannot be replayed by this one"
            )
        config = data["config"]
        described = _describe(config)
        table = format_table(results)  # a wrongly typed field fails here, not mid-print
        title = _title(config)
    except KeyError as e:
        raise ShapeBucketError(
            f"{args.from_json} is not a saved benchmark run: no {e} entry"
        ) from None
    except ShapeBucketError:
        raise
    except (OSError, ValueError, TypeError) as e:
        raise ShapeBucketError(f"{args.from_json} is not a saved benchmark run: {e}") from None
    path = str(
        output_path(
            "--plot", args.plot or Path(args.from_json).with_suffix(".png"), formats=plot_formats()
        )
    )
    print(described)
    print(table)
    plot(results, path, title)
    print(f"wrote {path}")
    return 0


def _describe(config: dict[str, Any]) -> str:
    return (
        f"shapebucket steps/sec benchmark: workload {config['workload']} ({config['samples']:,} samples, "
        f"mean length {config['mean_length']:.1f}, {config['clipped_to_max_len']} clipped to "
        f"{config['model']['max_len']}), batch {config['batch_size']}, buckets {config['buckets']}, "
        f"{config['rounds']} rounds x one epoch of {config['timed_samples']:,} samples "
        f"({config['timed_real_tokens']:,} real tokens), model {config['model']}, "
        f"torch {config['torch']}, {config['device']}"
        f"{', mode ' + str(config['mode']) if config['mode'] else ''}, {config['machine']}"
        f"{describe_profile(config)}\n"
        f"peers: {', '.join(n for n in config['strategies'] if n in PEERS)} "
        f"({config['grouped_sampler']})"
    )


def _title(config: dict[str, Any]) -> str:
    return (
        f"{config['workload']}, batch {config['batch_size']}, torch {config['torch']}, "
        f"{config['device']}{', ' + str(config['mode']) if config['mode'] else ''}"
    )


def _resolve(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on --profile, --quick and the lengths (loaded here,
    once, into ``args.workload_lengths``) and check every number."""
    apply_profile(args)
    batch_from_tokens = args.batch_size is None and args.tokens_per_step is not None
    fill_defaults(args, _DEFAULTS)
    for key in (
        "rounds",
        "epoch_samples",
        "batch_size",
        "k",
        "model_dim",
        "depth",
        "heads",
        "vocab",
    ):
        check_int(f"--{key.replace('_', '-')}", getattr(args, key), minimum=1)
    check_int("--samples", args.samples, minimum=1, maximum=MAX_DRAWN)
    check_int("--warmup-steps", args.warmup_steps, minimum=1)
    check_int("--max-len", args.max_len, minimum=8)
    check_int("--seed", args.seed, minimum=0)
    if args.model_dim % args.heads:
        raise ShapeBucketError(
            f"--model-dim {args.model_dim} must be a multiple of --heads {args.heads}"
        )
    given = args.strategies
    args.strategies = _strategy_names(given)
    _check_device(args.device)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ShapeBucketError("--device cuda but torch.cuda.is_available() is False")
    args.strategies = for_device(args.strategies, args.device, everything=given == "all")
    if args.mode == "reduce-overhead" and not args.device.startswith("cuda"):
        raise ShapeBucketError(
            "--mode reduce-overhead captures CUDA graphs: it needs --device cuda"
        )
    _check_attention(args)
    args.workload_lengths = load_workload(
        args.workload,
        n=args.samples,
        max_len=args.max_len,
        seed=args.seed,
        lengths_file=args.lengths,
    )
    lengths = args.workload_lengths[0]
    if batch_from_tokens:  # the grouped peers' batch: as many samples as carry the tokens
        args.batch_size = max(1, round(args.tokens_per_step / float(lengths.mean())))
    if args.bucket_tokens_per_batch is None:
        args.bucket_tokens_per_batch = args.batch_size * 32
    check_int("--bucket-tokens-per-batch", args.bucket_tokens_per_batch, minimum=args.max_len)
    if args.packed_tokens_per_batch is not None:
        check_int("--packed-tokens-per-batch", args.packed_tokens_per_batch, minimum=args.max_len)
    else:  # the real tokens of an average batch, rounded up to whole rows of the longest row
        mean_batch = math.ceil(args.batch_size * float(lengths.mean()))
        args.packed_tokens_per_batch = round_up(mean_batch, round_up(int(lengths.max()), 8))
    stem = f"results/steps_per_sec_{args.workload}{'_quick' if args.quick else ''}"
    if args.json is None:
        args.json = stem + ".json"
    if args.plot is None:
        args.plot = str(Path(args.json).with_suffix(".png")) if args.json else stem + ".png"


def _strategy_names(given: str | None) -> list[str]:
    """The strategies ``--strategies`` names (default :data:`~.strategies.DEFAULT`,
    ``all``: every one), each once and each known."""
    names = {None: list(DEFAULT), "all": list(STRATEGIES)}.get(given, str(given).split(","))
    strategies = [n.strip() for n in names if n.strip()]
    if not strategies:
        raise ShapeBucketError(
            f"--strategies {given!r} names no strategy; pass 'all' or names from: "
            f"{', '.join(STRATEGIES)}"
        )
    twice = sorted({n for n in strategies if strategies.count(n) > 1})
    if twice:
        raise ShapeBucketError(
            f"--strategies names {', '.join(twice)} twice; name each strategy once"
        )
    unknown = [n for n in strategies if n not in STRATEGIES]
    if unknown:
        raise ShapeBucketError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    return strategies


def _check_device(name: str) -> None:
    """Refuse a ``--device`` that is not a cpu or cuda torch device."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ShapeBucketError(
            f"--device {name!r} is not a torch device; pass cpu or cuda (cuda:0)"
        ) from None
    if device.type not in ("cpu", "cuda"):
        raise ShapeBucketError(
            f"--device {name!r}: the benchmark times real steps on cpu or cuda, not on "
            f"a {device.type} device; pass cpu or cuda (cuda:0)"
        )


def _check_attention(args: argparse.Namespace) -> None:
    """Refuse ``--attention flex`` where one tiny ``flex_attention`` step cannot run
    forward and backward on ``--device``, naming what torch said and the fix."""
    if args.attention != "flex":
        return
    device = torch.device(args.device)
    try:
        from torch.nn.attention.flex_attention import flex_attention

        q = torch.randn(1, 1, 16, 8, device=device, requires_grad=True)
        flex_attention(q, q, q).sum().backward()  # type: ignore[union-attr]
    except (NotImplementedError, RuntimeError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ShapeBucketError(
            f"--attention flex cannot train on --device {args.device} with torch "
            f"{torch.__version__}: {first}; run it with --device cuda, or leave --attention "
            "sdpa (the dense document mask)"
        ) from None


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file the run writes, checked before anything is measured: ``--json`` and
    ``--plot`` are file names whose directories exist or can be made (the default
    ``results/`` is made), and the plot's extension is one matplotlib writes."""
    if args.json:
        args.json = str(output_path("--json", args.json, make_dirs=True))
    if args.plot:
        args.plot = str(output_path("--plot", args.plot, formats=plot_formats(), make_dirs=True))


def _status(results: list[StrategyResult], padding_problems: list[str], no_check: bool) -> int:
    """Print the failed checks; 1 when one fails (a loss check only without --no-check)."""
    status = 0
    for r in results:
        if not r.peer and r.error is None and r.timed_recompiles:
            print(
                f"FAIL: {r.name} compiled {r.timed_recompiles} graphs while timed", file=sys.stderr
            )
            status = 1
    problems = check_losses(results)
    for title, found in (
        ("strategies that saw the same batches disagree on the loss:", problems),
        ("the same samples padded two ways give different losses:", padding_problems),
    ):
        if found:
            print(f"FAIL: {title}", file=sys.stderr)
            for line in found:
                print("  " + line, file=sys.stderr)
            if not no_check:
                status = 1
    if not problems and not padding_problems:
        print(
            "loss checks: strategies of one family agree at every step; padding does not change the loss"
        )
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``python -m shapebucket bench --help``); the exit status is 2 for
    a usage mistake (one ``error:`` line, before anything is measured), 1 when a check
    fails, 0 otherwise."""
    args = _parser().parse_args(argv)
    try:
        if args.from_json is not None:
            return _replay(args)
        _resolve(args)
        _check_outputs(args)
    except ShapeBucketError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config, results, padding_problems = run(args)
    print()
    print(_describe(config))
    print(format_table(results))
    for path in (args.json, args.plot):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if args.json:
        payload = run_payload(config, headline(results), results)
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot, _title(config))
        print(f"wrote {args.plot}")
    return _status(results, padding_problems, args.no_check)

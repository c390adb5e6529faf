"""Named benchmark profiles: one flag (``--profile gpu``) that sets a whole run's size.

The default benchmark is sized for a CPU: a tiny model and steps of ~1,500 real tokens,
where a step costs its overhead, not its arithmetic. The ``gpu`` profile is sized like a
real fine-tuning step: at least 16k tokens a step (``--tokens-per-step``), sample lengths
up to 2,048 from a long-tailed mixture (the ``long-mixture`` workload,
:func:`~shapebucket.bench.workloads.long_mixture_lengths`), a model of 4
blocks of width 1,024 (bf16 autocast on CUDA), and every strategy at the same tokens a
step: the bucket and packing budgets are the tokens a step, the fixed-length packing
peer's rows are ``tokens // max_len`` rows of ``max_len``, and the grouped peers' batch
is ``tokens / mean length`` samples (:func:`batch_size_for`).

``--profile gpu --quick`` is the same run at a reduced size that a CPU runs in minutes.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from .._argparse import MAX_DRAWN
from .._validate import check_int
from ..errors import ShapeBucketError
from .strategies import CUDA_ONLY
from .workloads import load_workload

__all__ = [
    "PROFILES",
    "Profile",
    "add_profile_flags",
    "apply_profile",
    "batch_size_for",
    "describe_profile",
    "profile_config",
]


@dataclass(frozen=True)
class Size:
    """The settings of one size of a profile (the full run or ``--quick``)."""

    tokens_per_step: int
    max_len: int
    model_dim: int
    depth: int
    heads: int
    k: int
    epoch_samples: int
    samples: int
    rounds: int


@dataclass(frozen=True)
class Profile:
    """A named benchmark size: ``full`` for the machine it names, ``quick`` for a CPU."""

    name: str
    about: str
    workload: str
    strategies: tuple[str, ...]
    full: Size
    quick: Size

    def size(self, quick: bool) -> Size:
        return self.quick if quick else self.full


PROFILES: dict[str, Profile] = {
    "gpu": Profile(
        name="gpu",
        about="real step sizes: >=16k tokens a step, lengths up to 2,048 (long-tailed), "
        "4 blocks of width 1,024, bf16 autocast on cuda; every strategy at the same tokens "
        "a step",
        workload="long-mixture",
        strategies=(
            "grouped-mark-dynamic",
            "grouped-dynamic",
            "fixed-packed-compile",
            "shapebucket",
            "shapebucket-tokens",
            "shapebucket-packed",
            "shapebucket-calibrated",
        ),
        full=Size(
            tokens_per_step=16_384,
            max_len=2_048,
            model_dim=1_024,
            depth=4,
            heads=16,
            k=4,
            epoch_samples=4_000,
            samples=100_000,
            rounds=5,
        ),
        quick=Size(
            tokens_per_step=1_024,
            max_len=256,
            model_dim=32,
            depth=1,
            heads=4,
            k=2,
            epoch_samples=200,
            samples=5_000,
            rounds=2,
        ),
    ),
}


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    """``--profile`` and ``--tokens-per-step``."""
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="a named size: gpu = "
        + PROFILES["gpu"].about
        + " (with --quick: a reduced size a CPU runs)",
    )
    p.add_argument(
        "--tokens-per-step",
        type=int,
        default=None,
        help="every strategy at this many tokens a step: the bucket and packing budgets, "
        "fixed packing's rows x max-len, and the grouped peers' batch of tokens / mean "
        "length samples (the gpu profile: 16,384)",
    )
    p.add_argument(
        "--rows-budget-mb",
        type=float,
        default=None,
        help="shapebucket-calibrated's memory budget in MB: rows per row length from "
        "calibrate_rows within it (without it: the peak shapebucket-packed's token budget "
        "needs at its longest row length)",
    )


def apply_profile(args: argparse.Namespace) -> None:
    """Fill ``args`` from ``--profile`` (settings the user passed are kept, except the
    profile's workload, ``--max-len`` and ``--heads``, which make the profile), then turn
    ``--tokens-per-step`` into every strategy's budget. Runs before the other defaults."""
    profile = PROFILES[args.profile] if args.profile else None
    budget = args.rows_budget_mb
    if budget is not None and not (isinstance(budget, float) and 0 < budget < float("inf")):
        raise ShapeBucketError(
            f"--rows-budget-mb {budget} must be a positive number of MB (the memory "
            "shapebucket-calibrated's rows may use a step), e.g. --rows-budget-mb 40000"
        )
    if profile is not None:
        size = profile.size(args.quick)
        args.workload = profile.workload
        args.max_len = size.max_len
        args.heads = size.heads
        for key in ("tokens_per_step", "model_dim", "depth", "k", "epoch_samples", "samples"):
            if getattr(args, key) is None:
                setattr(args, key, getattr(size, key))
        if args.rounds is None:
            args.rounds = size.rounds
        if args.strategies is None:  # on CUDA the CUDA-graph strategies too
            cuda = str(args.device).startswith("cuda")
            args.strategies = ",".join((*profile.strategies, *(CUDA_ONLY if cuda else ())))
        if args.json is None:
            args.json = f"results/profile_{profile.name}{'_quick' if args.quick else ''}.json"
    if args.tokens_per_step is None:
        return
    check_int("--tokens-per-step", args.tokens_per_step, minimum=args.max_len)
    for key in ("bucket_tokens_per_batch", "packed_tokens_per_batch"):
        if getattr(args, key) is None:
            setattr(args, key, args.tokens_per_step)
    if args.batch_size is None:
        args.batch_size = batch_size_for(args)


def batch_size_for(args: argparse.Namespace) -> int:
    """The grouped peers' batch at ``--tokens-per-step``: as many samples as carry that
    many real tokens on average over the workload's lengths."""
    check_int("--samples", args.samples or 1, minimum=1, maximum=MAX_DRAWN)
    lengths = load_workload(
        args.workload,
        n=args.samples or 20_000,
        max_len=args.max_len,
        seed=args.seed,
        lengths_file=args.lengths,
    )[0]
    return max(1, round(args.tokens_per_step / float(lengths.mean())))


def profile_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The profile as the JSON records it (None without ``--profile``)."""
    if not getattr(args, "profile", None):
        return None
    profile = PROFILES[args.profile]
    return {
        "name": profile.name,
        "about": profile.about,
        "quick": bool(args.quick),
        "size": asdict(profile.size(args.quick)),
        "tokens_per_step": args.tokens_per_step,
        "rows_budget_mb": args.rows_budget_mb,
    }


def describe_profile(config: dict[str, Any]) -> str:
    """The header's profile line ('' for a run without one)."""
    profile = config.get("profile")
    tokens = config.get("tokens_per_step")
    if not profile and not tokens:
        return ""
    name = f"profile {profile['name']}{' (quick)' if profile['quick'] else ''}: " if profile else ""
    return f"\n{name}{tokens:,} tokens a step for every strategy" + (
        f"; {profile['about']}" if profile else ""
    )

"""Named benchmark sizes (``--profile gpu``) and ``--tokens-per-step``: every strategy at
the same tokens a step (docs/benchmarks.md, "The GPU profile")."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from .._validate import check_int, check_number
from .strategies import CUDA_ONLY

__all__ = [
    "PROFILES",
    "Profile",
    "apply_profile",
    "describe_profile",
    "fill_defaults",
    "profile_config",
    "sized",
]


@dataclass(frozen=True)
class Profile:
    """A named benchmark size: ``sizes`` maps a setting to its (full run, ``--quick``) value."""

    name: str
    about: str
    workload: str
    strategies: tuple[str, ...]
    sizes: dict[str, tuple[int, int]]


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
        sizes={
            "tokens_per_step": (16_384, 1_024),
            "max_len": (2_048, 256),
            "model_dim": (1_024, 32),
            "depth": (4, 1),
            "heads": (16, 4),
            "k": (4, 2),
            "epoch_samples": (4_000, 200),
            "samples": (100_000, 5_000),
            "rounds": (5, 2),
        },
    ),
}


def sized(sizes: dict[str, tuple[int, int]], quick: bool) -> dict[str, int]:
    """Each setting's full-run or ``--quick`` value."""
    return {key: small if quick else full for key, (full, small) in sizes.items()}


def fill_defaults(args: argparse.Namespace, sizes: dict[str, tuple[int, int]]) -> None:
    """Set each setting of ``sizes`` the user left unset to its full or ``--quick`` value."""
    for key, value in sized(sizes, args.quick).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def apply_profile(args: argparse.Namespace) -> None:
    """Fill ``args`` from ``--profile`` (settings the user passed are kept, except the
    profile's workload, ``--max-len`` and ``--heads``, which make the profile), then turn
    ``--tokens-per-step`` into the bucket and packing budgets (the grouped peers' batch
    size needs the lengths: :mod:`.cli` sets it). Runs before the other defaults."""
    if args.rows_budget_mb is not None:
        check_number(
            "--rows-budget-mb",
            args.rows_budget_mb,
            above=0,
            hint="; the MB shapebucket-calibrated's rows may use a step, e.g. 40000",
        )
    if args.profile:
        profile = PROFILES[args.profile]
        size = sized(profile.sizes, args.quick)
        args.workload, args.max_len, args.heads = profile.workload, size["max_len"], size["heads"]
        fill_defaults(args, profile.sizes)
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


def profile_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The profile as the JSON records it (None without ``--profile``)."""
    if not args.profile:
        return None
    profile = PROFILES[args.profile]
    return {
        "name": profile.name,
        "about": profile.about,
        "quick": bool(args.quick),
        "size": sized(profile.sizes, args.quick),
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

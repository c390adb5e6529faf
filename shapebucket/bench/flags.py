"""The flags of ``python -m shapebucket bench``, by what they set; :mod:`.cli` builds its
parser from them, fills the defaults that depend on ``--quick`` and checks their values."""

from __future__ import annotations

import argparse

from .profiles import PROFILES
from .strategies import DEFAULT, STRATEGIES
from .workloads import WORKLOADS

__all__ = ["add_flags"]


def add_flags(p: argparse.ArgumentParser) -> None:
    """Every flag of the benchmark, in ``--help``'s order."""
    p.add_argument("--quick", action="store_true", help="a small smoke run (tiny model, k=2)")
    for group in (
        _profile_flags,
        _workload_flags,
        _timing_flags,
        _batching_flags,
        _model_flags,
        _output_flags,
    ):
        group(p)


def _profile_flags(p: argparse.ArgumentParser) -> None:
    """A whole run's size, and every strategy at the same tokens a step."""
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


def _workload_flags(p: argparse.ArgumentParser) -> None:
    """The lengths and the strategies run on them."""
    p.add_argument("--workload", choices=WORKLOADS, default="mixture")
    p.add_argument(
        "--lengths",
        metavar="FILE",
        help="your own lengths (one int per line, or .npy); overrides --workload's lengths",
    )
    p.add_argument(
        "--strategies",
        default=None,
        help="'all', or a comma-separated subset of: "
        + ", ".join(STRATEGIES)
        + " (default: "
        + ", ".join(DEFAULT)
        + ")",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="samples drawn for mixture and captioning (default 200,000, quick 20,000)",
    )
    p.add_argument(
        "--fixed-packer",
        choices=["bfd", "next-fit"],
        default="bfd",
        help="the fixed-length packing peer's packer: bfd (TRL pack_dataset) or next-fit "
        "(torchtune PackedDataset)",
    )


def _timing_flags(p: argparse.ArgumentParser) -> None:
    """Where and how each strategy is timed."""
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda (bf16 autocast)")
    p.add_argument(
        "--mode",
        default=None,
        choices=[None, "default", "reduce-overhead", "max-autotune"],
        help="torch.compile mode (reduce-overhead: CUDA graphs, GPU only)",
    )
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5, quick 2)")
    p.add_argument(
        "--no-limit",
        action="store_true",
        help="leave out the physical-limit reference row (it compiles a few grid lengths)",
    )
    p.add_argument(
        "--epoch-samples",
        type=int,
        default=None,
        help="samples of the timed set, one whole epoch of it per round (default 6,000, quick 400)",
    )
    p.add_argument(
        "--warmup-steps", type=int, default=None, help="steps after compiling (default 3, quick 1)"
    )


def _batching_flags(p: argparse.ArgumentParser) -> None:
    """How batches are formed and how packed rows attend."""
    p.add_argument("--batch-size", type=int, default=None, help="default 64, quick 16")
    p.add_argument(
        "--bucket-tokens-per-batch",
        type=int,
        default=None,
        help="tokens_per_batch of shapebucket-tokens' BucketBatchSampler (default: batch "
        "size x 32)",
    )
    p.add_argument(
        "--packed-tokens-per-batch",
        type=int,
        default=None,
        help="tokens_per_batch of shapebucket-packed's PackedBatchSampler (default: the real "
        "tokens of batch-size average samples, rounded up to whole rows of the longest row)",
    )
    p.add_argument("--k", type=int, default=None, help="fitted buckets (default 8, quick 2)")
    p.add_argument(
        "--attention",
        choices=("sdpa", "flex"),
        default="sdpa",
        help="how packed rows attend: sdpa, a dense document mask (every masked pair "
        "computed), or flex, flex_attention under the document BlockMask built from block "
        "tensors the collator makes (needs flex_attention's backward on --device)",
    )


def _model_flags(p: argparse.ArgumentParser) -> None:
    """The benchmark's model."""
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument(
        "--model-dim", type=int, default=None, help="model width (default 128, quick 32)"
    )
    p.add_argument("--depth", type=int, default=None, help="blocks (default 2, quick 1)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)


def _output_flags(p: argparse.ArgumentParser) -> None:
    """The compile cache, the files a run writes, the checks' exit status, the replay."""
    p.add_argument(
        "--cache",
        choices=["fresh", "shared"],
        default="fresh",
        help="fresh: an empty compile cache per strategy (honest warm-up); shared: reuse",
    )
    p.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="default results/steps_per_sec_<workload>[_quick].json ('' for none)",
    )
    p.add_argument(
        "--plot", default=None, metavar="PATH", help="default: the --json path with .png"
    )
    p.add_argument(
        "--no-check", action="store_true", help="do not fail when a correctness check fails"
    )
    p.add_argument(
        "--from-json",
        metavar="PATH",
        help="measure nothing: print the table and headline of a saved run and write its plot "
        "(--plot, default next to the JSON)",
    )

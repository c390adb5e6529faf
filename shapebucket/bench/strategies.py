"""The benchmark's strategies (:data:`PEERS`: what users do instead) and the record of each."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ShapeBucketError

__all__ = [
    "CUDA_ONLY",
    "DEFAULT",
    "PEERS",
    "STRATEGIES",
    "Strategy",
    "StrategyResult",
    "for_device",
]


@dataclass(frozen=True)
class Strategy:
    """How one strategy forms (``family``: the same batches, so the same losses), pads and
    compiles its batches."""

    family: str  # "grouped", "fixed", "buckets", "tokens", "packed" or "calibrated"
    compile: dict[str, Any] | None  # torch.compile kwargs; None runs eagerly
    maybe_mark: bool = False  # maybe_mark_dynamic on the length
    prewarm: bool = False
    about: str = ""
    # torch.compile's mode for this strategy (None: --mode); "reduce-overhead" records a CUDA
    # graph per planned shape at prewarm and needs --device cuda
    mode: str | None = None


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
        maybe_mark=True,
        about="same batches, dynamic=False + maybe_mark_dynamic on the length",
    ),
    "grouped-dynamic": Strategy("grouped", {"dynamic": True}, about="same batches, dynamic=True"),
    "fixed-packed-eager": Strategy(
        "fixed",
        None,
        about="fixed-length packing (TRL pack_dataset bfd / torchtune PackedDataset): rows of the "
        "maximum length, one shape, document mask, eager",
    ),
    "fixed-packed-compile": Strategy(
        "fixed", {"dynamic": False}, about="same batches, torch.compile (one shape, one graph)"
    ),
    "shapebucket": Strategy(
        "buckets",
        {"dynamic": False},
        prewarm=True,
        about="fitted buckets, BucketBatchSampler, rows rows, prewarmed, dynamic=False",
    ),
    "shapebucket-tokens": Strategy(
        "tokens",
        {"dynamic": False},
        prewarm=True,
        about="fitted buckets, BucketBatchSampler.for_tokens(...), prewarmed",
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
        about="fit_packing row lengths, PackedBatchSampler.for_tokens(...), "
        "PackedCollator, document mask, prewarmed",
    ),
    "shapebucket-calibrated": Strategy(
        "calibrated",
        {"dynamic": False},
        prewarm=True,
        about="packing's row lengths, rows calibrated to memory (calibrate_rows: the largest "
        "rows per row length within the peak shapebucket-packed's token budget needs at its "
        "longest row length), prewarmed",
    ),
    "shapebucket-graphs": Strategy(
        "buckets",
        {"dynamic": False},
        prewarm=True,
        mode="reduce-overhead",
        about="same batches as shapebucket, CUDA graphs (mode=reduce-overhead: forward and "
        "backward) recorded at prewarm for the plan's shapes only; CUDA only",
    ),
    "shapebucket-packed-graphs": Strategy(
        "packed",
        {"dynamic": False},
        prewarm=True,
        mode="reduce-overhead",
        about="same batches as shapebucket-packed, CUDA graphs (mode=reduce-overhead) "
        "recorded at prewarm for the plan's shapes only; CUDA only",
    ),
}
PEERS = tuple(n for n in STRATEGIES if not n.startswith("shapebucket"))
#: strategies that record CUDA graphs: refused without --device cuda
CUDA_ONLY = tuple(n for n, s in STRATEGIES.items() if s.mode == "reduce-overhead")


def for_device(names: list[str], device: str, *, everything: bool = False) -> list[str]:
    """``names`` that run on ``device``: the CUDA-graph strategies need CUDA. Asked for
    by name off CUDA they are refused; ``everything`` (``--strategies all``) leaves them
    out there.

    >>> for_device(["shapebucket", "shapebucket-graphs"], "cpu", everything=True)
    ['shapebucket']
    """
    if device.startswith("cuda"):
        return names
    if everything:
        return [n for n in names if n not in CUDA_ONLY]
    cuda_only = [n for n in names if n in CUDA_ONLY]
    if cuda_only:
        raise ShapeBucketError(
            f"--strategies {', '.join(cuda_only)} record CUDA graphs (mode=reduce-overhead): "
            f"they need --device cuda, not {device}; leave them out on a CPU"
        )
    return names


#: The default run: every peer, and packing eager and compiled (docs/benchmarks.md says why
#: the other strategies are left to ``--strategies all``).
DEFAULT = (*PEERS, "shapebucket-packed-eager", "shapebucket-packed")


@dataclass
class StrategyResult:
    """One strategy's line in the table and its entry in the JSON output (its fields are
    the JSON keys); ``error`` is set, and the figures left at zero, when it failed."""

    name: str
    family: str = ""
    peer: bool = False
    warmup_s: float = 0.0
    first_step_s: float = 0.0  # from the strategy's start to the end of its first step
    warmup_steps: int = 0  # training steps inside the warm-up
    warmup_epochs: float = 0.0  # epochs of the whole dataset trained inside the warm-up
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
    timed_token_efficiency: float = 0.0  # over the timed sample set's batches
    epoch_steps: int = 0
    round_epoch_s: list[float] = field(default_factory=list)  # each round's epoch seconds
    epoch_s: float = 0.0  # one epoch of the whole dataset at the median round's speed
    job_s: float = 0.0  # one epoch, warm-up included
    job10_s: float = 0.0  # ten epochs, warm-up included (paid once)
    peak_mem_mb: float = 0.0  # one step of its largest batch (see runner.peak_step_memory)
    warmup_peak_mem_mb: float = 0.0
    final_loss: float = float("nan")
    buckets: list[int] | None = None
    shapes: int = 0  # distinct batch shapes in the epoch
    step_times: list[float] = field(default_factory=list)
    compiled_steps: list[int] = field(default_factory=list)  # indices into step_times
    losses: list[float] = field(default_factory=list)
    # the physical limit (bench.limit): its own row's grid and costs; a strategy's share of
    # it and where the rest of its time goes
    limit: dict[str, Any] | None = None
    of_limit: float | None = None
    limit_gap: dict[str, float] | None = None
    # CUDA graphs: the memory the recorded graphs keep (torch.cuda.memory_reserved after
    # prewarm less before it), MB; None where no graph was recorded
    graph_memory_mb: float | None = None
    error: str | None = None

    @classmethod
    def from_saved(cls, entry: Any, where: str) -> StrategyResult:
        """One result of a saved run (``--from-json``): every field there (one that defaults
        to None may be missing: not measured by that run), each number a number >= 0
        (``final_loss`` may be NaN), each list of numbers one, refused naming the entry, the
        field and the value otherwise."""
        if not isinstance(entry, dict):
            raise ShapeBucketError(f"{where} is a {type(entry).__name__}, not a result")
        where = f"{where} ({entry.get('name', 'no name')!r})"
        names = [f.name for f in fields(cls)]
        missing = [f.name for f in fields(cls) if f.name not in entry and f.default is not None]
        unknown = [k for k in entry if k not in names]
        if missing or unknown:
            parts = [f"lacks {missing}"] * bool(missing) + [f"has unknown {unknown}"] * bool(
                unknown
            )
            raise ShapeBucketError(
                f"{where} {' and '.join(parts)}: it was not written by this version of the "
                "benchmark; run it again to replay it"
            )
        for f in (f for f in fields(cls) if f.name in entry):
            value, kind = entry[f.name], str(f.type)
            numbers = value if kind.startswith("list[") else [value]
            if kind in ("str", "bool") and type(value).__name__ != kind:
                raise ShapeBucketError(f"{where}: {f.name} must be a {kind}, got {value!r}")
            if kind in ("int", "float", "list[int]", "list[float]") and not (
                isinstance(numbers, list)
                and all(_measured(v, nan=f.name == "final_loss") for v in numbers)
            ):
                what = "a list of numbers" if kind.startswith("list[") else "a number"
                raise ShapeBucketError(f"{where}: {f.name} must be {what} >= 0, got {value!r}")
        return cls(**entry)

    def job_seconds(self, epochs: int, epoch_s: float | None = None) -> float:
        """Seconds to train ``epochs`` epochs of the whole dataset from a cold start: the
        warm-up, the steps that compiled while timed, and the epochs the warm-up's own
        training steps have not covered yet at ``epoch_s`` (default: the median round's).

        >>> r = StrategyResult("x", warmup_s=10.0, warmup_epochs=0.5)
        >>> r.job_seconds(1, epoch_s=100.0), r.job_seconds(10, epoch_s=100.0)
        (60.0, 960.0)
        """
        per_epoch = self.epoch_s if epoch_s is None else epoch_s
        left = max(0.0, epochs - self.warmup_epochs)
        return self.warmup_s + self.timed_compile_s + per_epoch * left


def _measured(value: Any, *, nan: bool) -> bool:
    """Whether ``value`` is a number a run measures: not a bool, >= 0 and finite (or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (nan and math.isnan(value)) or (math.isfinite(value) and value >= 0)

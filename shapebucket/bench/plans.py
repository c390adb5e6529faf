"""The benchmark's batch plans: one epoch of each family's batches, the collator that pads
them, and the batches each strategy runs (a few warm-up batches, then a proportional
sample of the epoch for the timed rounds)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._validate import round_up
from ..collate.bucket import BucketCollator
from ..collate.packed import PackedCollator
from ..plan.buckets import Buckets
from ..plan.packing_fit import PackingFitReport, fit_packing
from ..sampling.bucket import BucketBatchSampler
from ..sampling.packed import PackedBatchSampler
from .peers import length_grouped_indices

__all__ = [
    "SEQUENCE_KEYS",
    "Family",
    "Setup",
    "build_family",
    "make_samples",
    "plan_family",
    "systematic_sample",
]

SEQUENCE_KEYS = ["input_ids", "labels"]


@dataclass
class Setup:
    """What every strategy of one run shares: the workload, the model and its initial weights."""

    args: argparse.Namespace
    lengths: np.ndarray
    clipped: int  # lengths clipped to --max-len
    model_config: dict[str, Any]
    device: torch.device
    make_model: Callable[[], torch.nn.Module]
    init_state: dict[str, torch.Tensor]
    buckets: Buckets
    get_samples: Callable[[Sequence[int]], list[dict[str, torch.Tensor]]]


@dataclass
class Family:
    """One batch plan: an epoch of index batches, its collator, and the batches to run.
    Strategies of one family see the same batches in the same order."""

    collate: BucketCollator | PackedCollator
    epoch: list[np.ndarray]
    shapes: list[tuple[int, int]]  # (rows, padded or row length) of every epoch batch
    warmup: list[dict[str, Any]] = field(default_factory=list)
    timed: list[dict[str, Any]] = field(default_factory=list)
    timed_real: list[int] = field(default_factory=list)  # real tokens of each timed batch
    buckets: Buckets | None = None  # for packing: the row lengths samples are packed into
    rows: int | dict[int, int] | None = None
    packing: PackingFitReport | None = None

    @property
    def padded(self) -> list[int]:
        """Computed tokens (rows x padded length) of every epoch batch."""
        return [rows * length for rows, length in self.shapes]


def make_samples(
    lengths: np.ndarray, vocab: int, seed: int, image: tuple[int, ...] | None
) -> Callable[[Sequence[int]], list[dict[str, torch.Tensor]]]:
    """Samples with random token ids (and an image), the same for an index in every strategy."""

    def get(indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        out = []
        for i in indices:
            g = torch.Generator().manual_seed(seed * 1_000_003 + int(i))
            ids = torch.randint(0, vocab, (int(lengths[i]),), generator=g)
            sample = {"input_ids": ids, "labels": torch.roll(ids, -1)}
            if image is not None:
                sample["pixel_values"] = torch.randn(image, generator=g)
            out.append(sample)
        return out

    return get


def _collator(buckets: Buckets, rows: Any = None) -> BucketCollator:
    return BucketCollator(buckets, sequence_keys=SEQUENCE_KEYS, rows=rows)


def plan_family(family: str, s: Setup) -> Family:
    """One epoch of ``family``'s batches and the collator that pads them."""
    a, L = s.args, s.lengths
    if family == "grouped":
        # transformers' Trainer with group_by_length=True: LengthGroupedSampler's order,
        # cut into batches, padded to the longest sample rounded up to 8
        # (DataCollatorWithPadding(pad_to_multiple_of=8))
        order = length_grouped_indices(L, a.batch_size, seed=a.seed)
        epoch = [order[i : i + a.batch_size] for i in range(0, len(order), a.batch_size)]
        shapes = [(len(b), round_up(int(L[b].max()), 8)) for b in epoch]
        return Family(_collator(Buckets.multiples(8, a.max_len)), epoch, shapes)
    if family == "packed":
        if a.workload == "captioning" and a.lengths is None:
            raise RuntimeError(
                "skipped: packing puts several samples in a row, and the captioning model "
                "has one image per sample"
            )
        fit = fit_packing(
            L, a.k, tokens_per_batch=a.packed_tokens_per_batch, align=8, model_dim=a.dim
        )
        packer = PackedBatchSampler(L, fit.buckets, rows=fit.rows, seed=a.seed)
        epoch = [np.asarray(b) for b in packer]
        shapes = [(fit.rows[n], n) for n in packer.batch_buckets().tolist()]
        collate = PackedCollator(
            fit.buckets,
            rows=fit.rows,
            sequence_keys=SEQUENCE_KEYS,
            mask_key=None,
            label_shift="none",  # the bench samples carry labels aligned with their tokens
        )
        return Family(collate, epoch, shapes, buckets=fit.buckets, rows=fit.rows, packing=fit)
    if family == "buckets":
        sampler = BucketBatchSampler(L, s.buckets, batch_size=a.batch_size, seed=a.seed)
    else:
        sampler = BucketBatchSampler(
            L, s.buckets, tokens_per_batch=a.bucket_tokens_per_batch, seed=a.seed
        )
    rows = sampler.rows
    epoch = [np.asarray(b) for b in sampler]
    lengths = [s.buckets.bucket_for(int(L[b].max())) for b in epoch]
    shapes = [(rows[n], n) for n in lengths]
    return Family(_collator(s.buckets, rows), epoch, shapes, buckets=s.buckets, rows=rows)


def systematic_sample(
    epoch: list[np.ndarray], padded: list[int], n: int, seed: int
) -> list[np.ndarray]:
    """``n`` batches of the epoch, evenly spaced in the order of their computed tokens
    (so each length range appears in proportion to the epoch), in a shuffled order."""
    order = np.argsort(np.asarray(padded), kind="stable")
    n = min(n, len(epoch))
    picks = order[((np.arange(n) + 0.5) * len(epoch) / n).astype(np.int64)]
    np.random.default_rng(seed).shuffle(picks)
    return [epoch[i] for i in picks]


def build_family(family: str, s: Setup) -> Family:
    a = s.args
    fam = plan_family(family, s)
    to = s.device

    def collated(idx: np.ndarray) -> dict[str, Any]:
        b: dict[str, Any] = dict(fam.collate(s.get_samples(idx.tolist())))  # type: ignore[arg-type]
        return {
            k: v.to(to, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in b.items()
        }

    fam.warmup = [collated(b) for b in fam.epoch[: a.warmup_steps]]
    timed = systematic_sample(fam.epoch, fam.padded, a.steps, a.seed)
    fam.timed = [collated(b) for b in timed]
    fam.timed_real = [int(s.lengths[b].sum()) for b in timed]
    return fam

"""The run's shared setup and each family's batches: an epoch over the whole dataset, its
collator, a few warm-up batches, and one whole epoch of the timed sample set."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._lengths import round_up
from ..calibrate import calibrate_rows, steady_peak_bytes
from ..calibrate.report import RowsReport
from ..collate.blocks import WithDocumentBlocks
from ..collate.bucket import BucketCollator
from ..collate.device import to_device
from ..collate.packed import PackedCollator
from ..fit.buckets import Buckets
from ..fit.packing_fit import PackingFitReport, fit_packing
from ..plan.shapes import Shape
from ..sampling.bucket import BucketBatchSampler
from ..sampling.packed import PackedBatchSampler
from .model import FLEX_BLOCK_SIZE
from .peers import FixedLengthCollator, fixed_length_packs, length_grouped_indices

__all__ = [
    "SEQUENCE_KEYS",
    "Family",
    "Setup",
    "build_family",
    "epoch_batches",
    "make_samples",
    "step_autocast",
    "timed_sample_set",
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
    timed_ids: np.ndarray  # the timed set: every round trains on these samples
    packing: PackingFitReport | None = None  # packing's row lengths, fitted once
    calibrated: RowsReport | None = None  # the calibrated strategy's rows, measured once

    def training_step(
        self,
        fwd: Callable[[Any, dict[str, Any]], Any] = lambda model, batch: model(**batch),
        mark: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[Callable[[dict[str, Any]], torch.Tensor], torch.nn.Module, torch.optim.Optimizer]:
        """``(step, model, optimizer)``: one whole step (forward through ``fwd``, backward,
        AdamW) of a fresh copy of the run's model (seeded, its initial weights), in the
        timed steps' precision; ``mark``, if given, sees each batch first. The step returns
        a copy of the detached loss (under CUDA graphs the next replay overwrites it)."""
        torch.manual_seed(self.args.seed)
        model = self.make_model().to(self.device)
        model.load_state_dict(self.init_state)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        autocast = step_autocast(self.device)

        def step(batch: dict[str, Any]) -> torch.Tensor:
            if mark is not None:
                mark(batch)
            with autocast:
                loss = fwd(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach().clone()

        return step, model, opt


@dataclass
class Family:
    """One family's batches: an epoch of index batches, its collator, and the batches to run.
    Strategies of one family see the same batches in the same order."""

    collate: BucketCollator | PackedCollator | FixedLengthCollator
    epoch: list[np.ndarray]
    shapes: list[tuple[int, int]]  # (rows, padded or row length) of every epoch batch
    sizes: list[list[int]] | None = None  # fixed packing: samples per row of every batch
    warmup: list[dict[str, Any]] = field(default_factory=list)
    timed: list[dict[str, Any]] = field(default_factory=list)
    timed_real: list[int] = field(default_factory=list)  # real tokens of each timed batch
    warmup_real: list[int] = field(default_factory=list)  # real tokens of each warm-up batch
    buckets: Buckets | None = None  # for packing: the row lengths samples are packed into

    def collate_batch(self, samples: list[dict[str, torch.Tensor]], i: int) -> dict[str, Any]:
        """Epoch batch ``i``'s ``samples`` collated (fixed packing: in its packer's rows)."""
        if isinstance(self.collate, FixedLengthCollator):
            return self.collate(samples, self.sizes[i])  # type: ignore[index]
        return dict(self.collate(samples))


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


def epoch_batches(family: str, s: Setup, ids: np.ndarray | None = None) -> Family:
    """One epoch of ``family``'s batches over the samples ``ids`` (default: all), as indices
    into the whole dataset, and the collator that pads them."""
    a = s.args
    ids = np.arange(len(s.lengths)) if ids is None else ids
    if family == "grouped":
        return _grouped_batches(s, ids)
    if (
        family in ("packed", "fixed", "calibrated")
        and a.workload == "captioning"
        and a.lengths is None
    ):
        raise RuntimeError(
            "skipped: packing puts several samples in a row, and the captioning model "
            "has one image per sample"
        )
    if family == "fixed":
        return _fixed_batches(s, ids)
    if family in ("packed", "calibrated"):
        return _packed_batches(family, s, ids)
    return _bucket_batches(family, s, ids)


def _grouped_batches(s: Setup, ids: np.ndarray) -> Family:
    """transformers' Trainer with group_by_length=True: LengthGroupedSampler's order,
    cut into batches, padded to the longest sample rounded up to 8
    (DataCollatorWithPadding(pad_to_multiple_of=8)); a timed sample set is grouped in the
    mega-batches the whole dataset gets."""
    a, L = s.args, s.lengths[ids]
    order = length_grouped_indices(L, a.batch_size, seed=a.seed, dataset_size=len(s.lengths))
    local = [order[i : i + a.batch_size] for i in range(0, len(order), a.batch_size)]
    shapes = [(len(b), round_up(int(L[b].max()), 8)) for b in local]
    return Family(_collator(Buckets.multiples(8, a.max_len)), [ids[b] for b in local], shapes)


def _fixed_batches(s: Setup, ids: np.ndarray) -> Family:
    """Fixed-length packing (the peer's packer) into rows of ``--max-len``."""
    a, L = s.args, s.lengths[ids]
    rows = max(1, a.packed_tokens_per_batch // a.max_len)
    packs = fixed_length_packs(L, a.max_len, rows, seed=a.seed, packer=a.fixed_packer)
    epoch = [ids[np.asarray([i for r in b for i in r], dtype=np.int64)] for b in packs]
    sizes = [[len(r) for r in b] for b in packs]
    shapes = [(rows, a.max_len)] * len(packs)
    return Family(FixedLengthCollator(a.max_len, rows), epoch, shapes, sizes=sizes)


def _packed_batches(family: str, s: Setup, ids: np.ndarray) -> Family:
    """shapebucket's packing: row lengths fitted on the whole dataset (once), rows from the
    token budget or, for ``calibrated``, calibrated to memory (once)."""
    a, L = s.args, s.lengths[ids]
    if s.packing is None:  # row lengths fitted on the whole dataset
        s.packing = fit_packing(
            s.lengths,
            a.k,
            tokens_per_batch=a.packed_tokens_per_batch,
            align=8,
            model_dim=a.model_dim,
        )
    fit = s.packing
    rows = fit.rows
    if family == "calibrated":  # rows calibrated to memory, once
        if s.calibrated is None:
            s.calibrated = _calibrated_rows(s, fit)
        rows = s.calibrated.rows
    packer = PackedBatchSampler(L, fit.buckets, rows=rows, seed=a.seed)
    epoch = [ids[np.asarray(b, dtype=np.int64)] for b in packer]
    shapes = [(rows[n], n) for n in packer.batch_buckets().tolist()]
    # the bench samples carry labels aligned with their tokens
    collate: Any = PackedCollator(fit.buckets, rows=rows, mask_key=None, label_shift="none")
    if a.attention == "flex":  # each batch's document blocks, for the model's BlockMask
        collate = WithDocumentBlocks(collate, block_size=FLEX_BLOCK_SIZE)
    return Family(collate, epoch, shapes, buckets=fit.buckets)


def _bucket_batches(family: str, s: Setup, ids: np.ndarray) -> Family:
    """shapebucket's buckets: ``--batch-size`` rows (``buckets``), or a token budget per
    batch (``tokens``)."""
    a, L = s.args, s.lengths[ids]
    if family == "buckets":
        sampler = BucketBatchSampler(L, s.buckets, rows=a.batch_size, seed=a.seed)
    else:
        sampler = BucketBatchSampler.for_tokens(
            L, s.buckets, a.bucket_tokens_per_batch, seed=a.seed
        )
    rows_ = sampler.rows
    local_b = [np.asarray(b, dtype=np.int64) for b in sampler]
    shapes = [(rows_[n], n) for n in (s.buckets.bucket_for(int(L[b].max())) for b in local_b)]
    return Family(_collator(s.buckets, rows_), [ids[b] for b in local_b], shapes, buckets=s.buckets)


def _calibrated_rows(s: Setup, fit: PackingFitReport) -> RowsReport:
    """``shapebucket-calibrated``'s rows: for each row length of ``fit``, the most rows within
    ``--rows-budget-mb`` when given, else within the token budget's peak at its longest row
    length, measured with the run's training step (:meth:`Setup.training_step`), no margin."""
    vocab = int(s.model_config["vocab"])

    def make_batch(shape: Shape) -> dict[str, Any]:
        # every row one sample as long as the row: the mask and the activations are as large
        # however a row is filled
        ids = torch.randint(0, vocab, (shape.length,))
        collate = PackedCollator([shape.length], rows=shape.rows, mask_key=None, label_shift="none")
        return to_device(
            collate([{"input_ids": ids, "labels": ids}] * shape.rows), s.device, non_blocking=True
        )

    longest = max(fit.buckets)
    stated = s.args.rows_budget_mb
    if stated is not None:
        budget = int(stated * 2**20)
    else:
        step, model, opt = s.training_step()
        batch = make_batch(Shape(fit.rows[longest], longest))
        budget = steady_peak_bytes(lambda: step(batch), model, opt, batch, device=s.device)
    step, model, opt = s.training_step()
    return calibrate_rows(
        model, list(fit.buckets), budget, make_batch, step=step, restore=[opt], margin=0.0
    )


def timed_sample_set(n: int, size: int, seed: int) -> np.ndarray:
    """The samples every timed round trains on: ``size`` of the ``n`` samples drawn at
    random (all of them when ``size >= n``), sorted; every strategy batches the same ones.

    >>> timed_sample_set(10, 4, seed=0).tolist()
    [3, 4, 6, 9]
    >>> len(timed_sample_set(10, 40, seed=0))
    10
    """
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed + 1).choice(n, size=size, replace=False))


def build_family(family: str, s: Setup) -> Family:
    """The family's epoch over the whole dataset (its shapes and token efficiency), its
    warm-up batches (the first of that epoch) and its timed batches: one epoch of the timed
    sample set, collated once."""
    a = s.args
    fam = epoch_batches(family, s)
    timed = epoch_batches(family, s, s.timed_ids)
    to = s.device

    def collated(batches: Family, i: int) -> dict[str, Any]:
        return to_device(
            batches.collate_batch(s.get_samples(batches.epoch[i].tolist()), i),
            to,
            non_blocking=True,
        )

    fam.warmup = [collated(fam, i) for i in range(min(a.warmup_steps, len(fam.epoch)))]
    fam.warmup_real = [int(s.lengths[b].sum()) for b in fam.epoch[: len(fam.warmup)]]
    fam.timed = [collated(timed, i) for i in range(len(timed.epoch))]
    fam.timed_real = [int(s.lengths[b].sum()) for b in timed.epoch]
    return fam


def step_autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The precision of every bench step on ``device``: bf16 autocast on CUDA, none on a
    CPU. The memory calibration measures under the same context as the timed steps."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()

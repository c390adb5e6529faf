"""docs/sampler.md's StatefulDataLoader recipe, resumed at every position of a run
(issue 39 item 12): a checkpoint taken after an epoch's last batch trained the next
epoch twice, because the state said "the next epoch, from its start" while the
checkpoint's ``epoch`` (the loop's) was the one just finished, and ``set_epoch`` of it
was then undone by the state that ``StatefulDataLoader`` loads inside ``iter()``.

For each sampler (bucket, packed, cell), 0 and 2 workers, the state is saved after
every batch ``k`` of a two-epoch run (the last batch of each epoch included), goes
through ``torch.save``/``torch.load`` into fresh objects and the run resumes; the
batches of the whole run must equal an uninterrupted run's. Two loops: the docs recipe
(``set_epoch`` every epoch, the loop's epoch saved beside the loader's state), and one
without ``set_epoch``, which resumes at the epoch it counts from its steps.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from shapebucket import BucketBatchSampler, PackedBatchSampler
from shapebucket.sampling import CellBatchSampler

sdl = pytest.importorskip("torchdata.stateful_dataloader")

EPOCHS = 2
LENGTHS = np.random.default_rng(3).integers(1, 17, 17)
TARGETS = np.random.default_rng(4).integers(1, 9, 17)
ROWS = {"rows": 3}  # the samplers' rows per batch (keyword-only)


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> int:
        return int(i)


def new_sampler(which: str):
    if which == "packed":
        return PackedBatchSampler(LENGTHS, [16, 32], rows={16: 2, 32: 1}, seed=5, window=8)
    if which == "cell":
        return CellBatchSampler(LENGTHS, TARGETS, [(8, 8), (16, 8)], seed=5, **ROWS)
    return BucketBatchSampler(LENGTHS, [4, 8, 16], seed=5, **ROWS)


def new_loader(which: str, workers: int):
    sampler = new_sampler(which)
    extra = {"prefetch_factor": 2} if workers else {}
    loader = sdl.StatefulDataLoader(
        Indices(), batch_sampler=sampler, collate_fn=list, num_workers=workers, **extra
    )
    return sampler, loader


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def run(which: str, workers: int, set_epoch: bool, stop_after: int | None = None):
    """The docs recipe's training loop: every batch of epochs 0..EPOCHS-1, stopping with a
    checkpoint after ``stop_after`` batches (then the checkpoint is returned too)."""
    sampler, loader = new_loader(which, workers)
    seen: list[list[int]] = []
    for epoch in range(EPOCHS):
        if set_epoch:
            sampler.set_epoch(epoch)
        for batch in loader:
            seen.append(batch)
            if len(seen) == stop_after:
                return seen, roundtrip({"loader": loader.state_dict(), "epoch": epoch})
    return seen, None


def resume(which: str, workers: int, set_epoch: bool, ckpt, start: int) -> list[list[int]]:
    """The recipe's resume: fresh objects, the loader's state, epochs ``start..``."""
    sampler, loader = new_loader(which, workers)
    loader.load_state_dict(ckpt["loader"])
    seen = []
    for epoch in range(start, EPOCHS):
        if set_epoch:
            sampler.set_epoch(epoch)
        seen.extend(loader)
    return seen


def epoch_of_steps(which: str, steps: int) -> int:
    """The epoch a loop that counts its steps resumes at (the epoch's batches all taken:
    the next one)."""
    for epoch in range(EPOCHS + 1):
        probe = new_sampler(which)
        probe.set_epoch(epoch)
        if steps < len(probe):
            return epoch
        steps -= len(probe)
    return EPOCHS


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("set_epoch", [True, False], ids=["set_epoch", "no_set_epoch"])
@pytest.mark.parametrize("which", ["bucket", "packed", "cell"])
def test_the_recipe_resumes_exactly_at_every_position(which, set_epoch, workers):
    reference, _ = run(which, workers, set_epoch)
    for k in range(1, len(reference) + 1):
        head, ckpt = run(which, workers, set_epoch, stop_after=k)
        assert ckpt is not None
        state = ckpt["loader"]
        # with set_epoch the recipe resumes at the loop's epoch; without it, at the one
        # a loop counting its steps is in
        start = ckpt["epoch"] if set_epoch else epoch_of_steps(which, k)
        got = head + resume(which, workers, set_epoch, ckpt, start)
        assert got == reference, (
            f"{which}, {workers} workers, set_epoch={set_epoch}: resumed after {k} of "
            f"{len(reference)} batches (state {state})"
        )

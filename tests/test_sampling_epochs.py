"""Issue 30 defect 6: the samplers' epoch sequence is a function of how many batches were
consumed, never of the worker count, the loader, or whether the iterator was exhausted.

A pass that takes every batch (``for batch in loader``, ``islice(loader, len(loader))``,
or ``next()`` exactly ``len(loader)`` times) completes its epoch; a pass abandoned before
its last batch (0 workers: nothing fetched ahead) completes nothing and the next pass
restarts where it started. Before the fix, ``islice``/``next`` passes replayed the same
epoch with 0 workers and moved on with 2, and a state saved there resumed differently.

The property runs on ``num_workers=0`` (hypothesis: the bare sampler, a plain
``DataLoader`` and torchdata's ``StatefulDataLoader``); a few parametrised cases run the
same loops with 2 workers, which are slow to start.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shapebucket.sampling import BucketBatchSampler, CellBatchSampler, PackedBatchSampler

torchdata = pytest.importorskip("torchdata.stateful_dataloader")

LENGTHS = np.random.default_rng(3).integers(1, 17, 19)
TARGETS = np.random.default_rng(4).integers(1, 9, 19)


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> int:
        return int(i)


def as_list(samples: list[int]) -> list[int]:
    return list(samples)


def new_sampler(which: str, size: int = 3):
    if which == "packed":
        return PackedBatchSampler(LENGTHS, [16, 32], rows={16: size, 32: 1}, seed=2, window=7)
    if which == "cells":
        return CellBatchSampler(LENGTHS, TARGETS, [(8, 8), (16, 8)], rows=size, seed=2)
    return BucketBatchSampler(LENGTHS, [4, 8, 16], rows=size, seed=2)


def new_loader(sampler, kind: str, workers: int = 0):
    if kind == "sampler":
        return sampler
    cls = DataLoader if kind == "plain" else torchdata.StatefulDataLoader
    extra = {"prefetch_factor": 2} if workers else {}
    return cls(Indices(), batch_sampler=sampler, collate_fn=as_list, num_workers=workers, **extra)


def take(loader, how: str, n: int) -> list[list[int]]:
    """One pass of a training loop over ``loader``: ``n`` batches taken as ``how`` takes
    them (``for``: every batch, the iterator exhausted)."""
    if how == "for":
        return list(loader)
    if how == "islice":
        return list(itertools.islice(loader, n))
    it = iter(loader)
    return [next(it) for _ in range(n)]


def epoch_batches(which: str, epoch: int, size: int = 3) -> list[list[int]]:
    ref = new_sampler(which, size)
    ref.set_epoch(epoch)
    return list(ref)


@settings(max_examples=40, deadline=None)
@given(
    which=st.sampled_from(["bucket", "cells", "packed"]),
    kind=st.sampled_from(["sampler", "plain", "stateful"]),
    size=st.integers(2, 6),
    passes=st.lists(
        st.tuples(st.sampled_from(["for", "islice", "next", "abandon"]), st.integers(0, 10)),
        min_size=1,
        max_size=6,
    ),
)
def test_the_epoch_sequence_depends_only_on_the_batches_consumed(which, kind, size, passes):
    """Each pass yields the batches of the epoch the model says; a state saved after each
    pass resumes the same sequence in fresh objects."""
    sampler = new_sampler(which, size)
    loader = new_loader(sampler, kind)
    epoch = 0  # the model: the epoch the next pass yields, from the start
    for how, k in passes:
        want = epoch_batches(which, epoch, size)
        n = len(loader)
        assert n == len(want), "len() is not the next pass's epoch"
        if how == "abandon":
            got = take(loader, "next", min(k, max(n - 1, 0)))
            assert got == want[: len(got)]
            if len(got) == n:  # an empty epoch: nothing left to abandon
                epoch += 1
        else:
            assert take(loader, how, n) == want, f"pass {how} of epoch {epoch} differs"
            epoch += 1
        if kind != "stateful" and (how != "abandon" or len(want) == 0):
            # between passes the state says the last epoch is complete (an empty one: the
            # next pass's start): a fresh sampler resumes at the next pass's start
            state = sampler.state_dict()
            done = (epoch - 1, len(want)) if len(want) else (epoch, 0)
            assert (state["epoch"], state["position"]) == done
            fresh = new_sampler(which, size)
            fresh.load_state_dict(state)
            assert list(fresh) == epoch_batches(which, epoch, size)
    assert sampler.epoch == epoch


@pytest.mark.parametrize("which", ["bucket", "packed"])
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_islice_passes_with_two_workers_match_zero_workers_and_resume(kind, which):
    """Two ``islice(loader, len(loader))`` passes with 2 workers yield epochs 0 and 1, as
    with 0 workers; the state saved after the second resumes with epoch 2 (before the
    fix, 0 workers replayed epoch 0, and the state saved with 2 workers resumed with an
    empty pass)."""
    want = [epoch_batches(which, e) for e in range(3)]
    for workers in (0, 2):
        sampler = new_sampler(which)
        loader = new_loader(sampler, kind, workers)
        got = [take(loader, "islice", len(loader)) for _ in range(2)]
        assert got == want[:2], f"{workers} workers"
        state = loader.state_dict() if kind == "stateful" else sampler.state_dict()
        fresh = new_sampler(which)
        resumed = new_loader(fresh, kind, workers)
        (resumed if kind == "stateful" else fresh).load_state_dict(state)
        # (a StatefulDataLoader loads the state at iter(), so len() before it is the fresh
        # sampler's; a packed epoch's count is the loop's to know then)
        got = list(itertools.islice(resumed, len(want[2])))
        assert got == want[2], f"{workers} workers, resumed"

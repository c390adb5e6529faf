"""Resume in real DataLoaders: save after every batch of an epoch, restore into fresh
objects, finish that epoch and the next; every index seen exactly once per epoch.

Matrix: plain ``DataLoader`` (state from ``sampler.state_dict(consumed=k)``) and
torchdata's ``StatefulDataLoader`` (state from ``loader.state_dict()``), 0 and 2
workers, 1 and 2 ranks, and two loop patterns (``set_epoch`` every epoch, or
letting the sampler advance by itself). Without workers every cell resumes after every
batch; with workers (slow: processes per resume) at the points prefetch changes
(``worker_ks``), one rank count per sampler. Every state goes through
``torch.save``/``torch.load``.
"""

from __future__ import annotations

import collections
import io
import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shapebucket import BucketBatchSampler, PackedBatchSampler
from shapebucket.fit import Buckets

torchdata = pytest.importorskip("torchdata.stateful_dataloader")

BUCKETS = Buckets([4, 8, 16])
LENGTHS = np.random.default_rng(7).integers(1, 17, 61)
EPOCHS = 2


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> int:
        return int(i)


def as_list(samples: list[int]) -> list[int]:
    return list(samples)


def new_sampler(which: str, replicas: int, rank: int):
    if which == "packed":  # rows of 16 and 32 tokens, 2 and 1 per batch; small windows
        return PackedBatchSampler(
            LENGTHS, [16, 32], rows={16: 2, 32: 1}, seed=5, window=20,
            num_replicas=replicas, rank=rank,
        )  # fmt: skip
    return BucketBatchSampler(
        LENGTHS, BUCKETS, rows=3, seed=5, num_replicas=replicas, rank=rank
    )


def make(kind: str, workers: int, replicas: int, rank: int, which: str = "bucket"):
    sampler = new_sampler(which, replicas, rank)
    cls = DataLoader if kind == "plain" else torchdata.StatefulDataLoader
    extra = {"prefetch_factor": 2} if workers else {}
    loader = cls(Indices(), batch_sampler=sampler, collate_fn=as_list, num_workers=workers, **extra)
    return sampler, loader


def run_epochs(sampler, loader, first: int, pattern: str, head: list | None = None):
    """Batches of epochs ``first..EPOCHS-1`` as the training loop sees them."""
    out = []
    for epoch in range(first, EPOCHS):
        if pattern == "set_epoch":
            sampler.set_epoch(epoch)
        out.append(list(loader))
    if head is not None:
        out[0] = head + out[0]
    return out


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def resumed(kind, workers, replicas, rank, pattern, k, which="bucket"):
    """Epochs 0..EPOCHS-1 of a run stopped after ``k`` batches of epoch 0 and resumed where a
    loop that counts its steps resumes: inside epoch 0, or once all of its batches were
    taken (the iterator not exhausted), at epoch 1."""
    sampler, loader = make(kind, workers, replicas, rank, which)
    if pattern == "set_epoch":
        sampler.set_epoch(0)
    n = len(sampler)
    it = iter(loader)
    head = [next(it) for _ in range(k)]
    state = sampler.state_dict(consumed=k) if kind == "plain" else loader.state_dict()
    del it, loader
    state = roundtrip(state)
    sampler, loader = make(kind, workers, replicas, rank, which)
    if kind == "plain":
        sampler.load_state_dict(state)
    else:
        loader.load_state_dict(state)
    if k == n:
        return [head, *run_epochs(sampler, loader, 1, pattern)]
    return run_epochs(sampler, loader, 0, pattern, head)


def check_matrix(kind, workers, replicas, pattern, ks=None, which="bucket"):
    reference = []
    for rank in range(replicas):
        sampler, loader = make(kind, workers, replicas, rank, which)
        reference.append(run_epochs(sampler, loader, 0, pattern))
    n = len(reference[0][0])
    # the two epochs differ, and all ranks see every index once per epoch
    assert reference[0][0] != reference[0][1]
    for epoch in range(EPOCHS):
        probe = new_sampler(which, replicas, 0)
        probe.set_epoch(epoch)
        duplicated = probe.stats.duplicated
        seen = collections.Counter(
            i for rank in range(replicas) for batch in reference[rank][epoch] for i in batch
        )
        assert set(seen) == set(range(len(LENGTHS)))
        assert sum(seen.values()) - len(LENGTHS) == duplicated
    for k in range(n + 1) if ks is None else ks:
        for rank in range(replicas):
            got = resumed(kind, workers, replicas, rank, pattern, k, which)
            assert got == reference[rank], (
                f"{which} sampler, {kind} loader, {workers} workers, rank {rank}/{replicas}, {pattern}: "
                f"resume after {k} of {n} batches differs"
            )


@pytest.mark.parametrize("pattern", ["set_epoch", "auto"])
@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_resume_matrix_in_process(kind, replicas, pattern):
    check_matrix(kind, 0, replicas, pattern)


def worker_ks(n: int) -> list[int]:
    """The resume points that differ with workers: the in-process matrix resumes after every
    batch through the same sampler code; what workers add is prefetch (2 workers x
    prefetch_factor 2 = 4 batches ahead of the loop), so the sampler runs ahead of the loop
    at the start (0, 1, 2) and in the middle, and reaches the epoch's end before the loop
    does in the last 4 + 1 batches (n - 5 .. n, the end of the epoch included)."""
    return sorted({0, 1, 2, n // 2, *range(max(n - 5, 0), n + 1)})


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["set_epoch", "auto"])
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_resume_matrix_with_workers(kind, pattern):
    """Bucket sampler, 1 rank (its longest epoch: 22 batches, so the middle is away from both
    prefetch edges); 2 ranks with workers run in the packed matrix below, and 2 ranks of the
    bucket sampler at every resume point in the in-process matrix (the rank split does not
    depend on the workers: the sampler runs in the main process)."""
    n = len(new_sampler("bucket", 1, 0))
    check_matrix(kind, 2, 1, pattern, ks=worker_ks(n))


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_packed_resume_matrix_in_process(kind, replicas):
    check_matrix(kind, 0, replicas, "set_epoch", which="packed")


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["set_epoch", "auto"])
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_packed_resume_matrix_with_workers(kind, pattern):
    """Packed sampler, 2 ranks with workers (each rank's epoch: 10 batches)."""
    n = len(new_sampler("packed", 2, 0))
    check_matrix(kind, 2, 2, pattern, ks=worker_ks(n), which="packed")


def test_plain_loader_state_without_consumed_runs_ahead():
    """What the consumed= argument is for: with workers the sampler has yielded more
    batches than the loop has consumed, and its own position says so."""
    sampler, loader = make("plain", 2, 1, 0)
    it = iter(loader)
    next(it)
    assert sampler.state_dict()["position"] > 1
    assert sampler.state_dict(consumed=1)["position"] == 1
    del it


def test_end_of_epoch_state_resumes_with_the_next_epoch():
    """Once an epoch's last batch is handed out, the state says the epoch is complete
    (position == num_batches, issue 39 item 12): a resume without set_epoch begins with
    the next epoch, not with an empty pass that leaves the loop one epoch behind. The same
    for a state saved inside the loop after its last batch (consumed == len): a loop that
    counts its steps resumes there at the next epoch, as from the next epoch's start."""
    sampler, loader = make("plain", 2, 1, 0)
    n = len(sampler)
    epoch0 = list(loader)  # the workers ran the sampler to its end long before this
    state = sampler.state_dict()
    assert (state["epoch"], state["position"], state["num_batches"]) == (0, n, n)
    fresh, fresh_loader = make("plain", 0, 1, 0)
    fresh.load_state_dict(roundtrip(state))
    ref, ref_loader = make("plain", 0, 1, 0)
    ref.set_epoch(1)
    epoch1 = list(ref_loader)
    assert list(fresh_loader) == epoch1 != epoch0
    sampler, loader = make("plain", 0, 1, 0)
    assert list(itertools.islice(loader, n)) == epoch0
    inside = sampler.state_dict(consumed=n)
    assert (inside["epoch"], inside["position"]) == (0, n)
    fresh, fresh_loader = make("plain", 0, 1, 0)
    fresh.load_state_dict(roundtrip(inside))
    assert list(fresh_loader) == epoch1
    fresh, fresh_loader = make("plain", 0, 1, 0)
    fresh.load_state_dict(roundtrip({**inside, "epoch": 1, "position": 0}))  # the same
    assert list(fresh_loader) == epoch1


def between_epochs(kind: str, workers: int, which: str, when: str) -> None:
    """Issue 22 item 2: epochs advance by themselves (no set_epoch); the state is saved
    after epoch 0's loop, either before ``iter(loader)`` for epoch 1 or after it, before
    its first batch. Resumed into fresh objects, the loop goes on with epochs 1 and 2."""
    sampler, loader = make(kind, workers, 1, 0, which)
    reference = [list(loader) for _ in range(3)]
    sampler, loader = make(kind, workers, 1, 0, which)
    assert list(loader) == reference[0]
    it = iter(loader) if when == "after_iter" else None
    if kind == "plain":
        state = sampler.state_dict(consumed=0) if it is not None else sampler.state_dict()
    else:
        state = loader.state_dict()
    del it, loader
    sampler, loader = make(kind, workers, 1, 0, which)
    (sampler if kind == "plain" else loader).load_state_dict(roundtrip(state))
    got = [list(loader) for _ in range(2)]
    assert got == reference[1:], f"{which}, {kind}, {workers} workers, saved {when}"


@pytest.mark.parametrize("when", ["after_loop", "after_iter"])
@pytest.mark.parametrize("which", ["bucket", "packed"])
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_state_between_epochs_resumes_the_next_epoch(kind, which, when):
    between_epochs(kind, 0, which, when)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["after_loop", "after_iter"])
@pytest.mark.parametrize("which", ["bucket", "packed"])
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_state_between_epochs_resumes_the_next_epoch_with_workers(kind, which, when):
    between_epochs(kind, 2, which, when)


def test_an_example_batch_taken_without_workers_skips_nothing():
    """Issue 22 item 10, the loader that fetches nothing ahead: ``next(iter(loader))``
    for an example batch abandons a pass; the next pass starts where it started."""
    _sampler, loader = make("plain", 0, 1, 0)
    ref, ref_loader = make("plain", 0, 1, 0)
    example = next(iter(loader))
    epoch0 = list(loader)
    assert epoch0[0] == example and epoch0 == list(ref_loader)
    # the same after a resume: an abandoned pass keeps the loaded resume point
    state = ref.state_dict(consumed=3)
    fresh, fresh_loader = make("plain", 0, 1, 0)
    fresh.load_state_dict(roundtrip(state))
    next(iter(fresh_loader))
    fresh.set_epoch(0)  # the loaded epoch: keeps the resume point
    assert list(fresh_loader) == epoch0[3:]


@pytest.mark.slow
def test_an_example_batch_taken_with_workers_follows_the_documented_rule():
    """Issue 22 item 10, with workers: prefetch runs a short epoch's pass to its end, so
    (as the docstring of shapebucket.sampling.base says) that epoch is complete and the
    next pass is epoch 1; set_epoch(0) at the start of the epoch gives epoch 0 back."""
    short = Indices()
    sampler = BucketBatchSampler(LENGTHS[:7], BUCKETS, rows=4, seed=5)
    assert len(sampler) <= 4  # prefetch_factor 2 x 2 workers fetches all of it
    loader = DataLoader(
        short, batch_sampler=sampler, collate_fn=as_list, num_workers=2, prefetch_factor=2
    )
    ref = BucketBatchSampler(LENGTHS[:7], BUCKETS, rows=4, seed=5)
    epochs = [list(ref), list(ref)]
    example = next(iter(loader))
    assert example == epochs[0][0]
    assert list(loader) == epochs[1]  # the documented consequence of prefetch
    sampler.set_epoch(0)
    next(iter(loader))
    sampler.set_epoch(0)
    assert list(loader) == epochs[0]


@pytest.mark.parametrize("which", ["bucket", "packed"])
def test_set_epoch_pins_every_pass_until_the_next_set_epoch(which):
    """As ``DistributedSampler``: after ``set_epoch(e)`` every pass is epoch ``e`` (a pass
    a loader's prefetch ran to the end moves nothing on), while ``epoch``/``state_dict``
    count the completed epoch: ``epoch`` is the next one, the state says epoch 2 is complete
    (issue 39 item 12), and a resumed run starts after it."""
    sampler, ref = new_sampler(which, 1, 0), new_sampler(which, 1, 0)
    ref.set_epoch(2)
    epoch2 = list(ref)
    sampler.set_epoch(2)
    assert list(sampler) == epoch2
    assert (sampler.epoch, sampler.state_dict()["epoch"], sampler.state_dict()["position"]) == (
        3, 2, len(epoch2),
    )  # fmt: skip
    assert len(sampler) == len(epoch2)  # the next pass's
    assert list(sampler) == epoch2
    half = iter(sampler)
    next(half)  # an abandoned pass restarts where it started
    assert list(sampler) == epoch2


@pytest.mark.slow
@pytest.mark.parametrize("which", ["bucket", "packed"])
def test_stateful_loader_with_workers_resumes_after_a_finished_short_epoch(which):
    """CI found it (stateful test): a ``StatefulDataLoader`` with workers restores a state
    saved after its iterator ended by prefetching the next epoch whole (it fits in
    ``prefetch_factor x num_workers``) and then discarding that iterator; the resumed run
    skipped that epoch. ``set_epoch`` (the documented loop) now pins it."""

    def short(which):
        lengths = LENGTHS[:12]
        if which == "packed":
            s = PackedBatchSampler(lengths, [16, 32], rows={16: 2, 32: 1}, seed=5, window=9)
        else:
            s = BucketBatchSampler(lengths, BUCKETS, rows=4, seed=5)
        loader = torchdata.StatefulDataLoader(
            Indices(), batch_sampler=s, collate_fn=as_list, num_workers=2, prefetch_factor=2
        )
        return s, loader

    sampler, loader = short(which)
    ref, _ = short(which)
    ref.set_epoch(1)
    epoch1 = list(ref)
    assert len(epoch1) <= 4  # the restore prefetches all of it
    sampler.set_epoch(0)
    for _ in loader:  # the iterator ends: the state says so
        pass
    state = roundtrip(loader.state_dict())
    sampler, loader = short(which)
    loader.load_state_dict(state)
    sampler.set_epoch(1)
    assert list(loader) == epoch1

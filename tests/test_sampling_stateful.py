"""A stateful test of the whole loop (issue 22): a training run drives a sampler through a
loader, epoch after epoch, and at any point saves, goes through ``torch.save`` /
``torch.load``, and resumes into fresh objects. Every epoch must yield exactly the batches
of an uninterrupted run: none lost, none repeated, in the same order.

What varies (hypothesis draws it): the sampler (bucket or packed), the loader (plain
``DataLoader`` with ``state_dict(consumed=...)``, or torchdata's ``StatefulDataLoader``
with its own ``state_dict``), 0 or 2 workers (slow variants only: 400 examples in process, 8 with 2
workers), the world size
and rank, ``set_epoch`` every epoch or epochs advancing by themselves, and the order of
the steps: begin an epoch (``iter``), take batches, end the epoch once every batch is
taken (seeing the iterator end, or not: issue 30 defect 6, ``islice(loader, len(loader))``
left the sampler in the same epoch with 0 workers and moved on with 2), save and resume
(before an epoch, between ``iter()`` and the first batch, mid-epoch, after its last batch,
after its end), and take an example batch with ``next(iter(loader))`` between epochs
(with workers only when ``set_epoch`` is used: see ``shapebucket.sampling.base`` on
prefetch).
"""

from __future__ import annotations

import gc
import io

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from torch.utils.data import DataLoader

from shapebucket.sampling import BucketBatchSampler, PackedBatchSampler

torchdata = pytest.importorskip("torchdata.stateful_dataloader")

LENGTHS = np.random.default_rng(11).integers(1, 17, 23)


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> int:
        return int(i)


def as_list(samples: list[int]) -> list[int]:
    return list(samples)


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def loop_machine(workers_choices: tuple[int, ...]) -> type[RuleBasedStateMachine]:
    class TrainingLoop(RuleBasedStateMachine):
        @initialize(
            which=st.sampled_from(["bucket", "packed"]),
            kind=st.sampled_from(["plain", "stateful"]),
            workers=st.sampled_from(workers_choices),
            world=st.sampled_from([(1, 0), (2, 0), (2, 1)]),
            set_epoch=st.booleans(),
            size=st.integers(2, 5),
            seed=st.integers(0, 3),
        )
        def start(self, which, kind, workers, world, set_epoch, size, seed):
            self.cfg = (which, kind, workers, world, size, seed)
            self.uses_set_epoch = set_epoch
            self.reference: dict[int, list[list[int]]] = {}
            self.epoch = 0  # the loop's epoch
            self.it = None  # the loop's iterator over the loader, while an epoch runs
            self.got: list[list[int]] = []  # this epoch's batches, as the loop consumed them
            self.example = False  # an example batch was taken since the last epoch began
            self.finished = False  # the last epoch's iterator was seen to end
            if workers:
                # a full gc.collect walks every object torch and hypothesis made (0.4 s a
                # call here, most of this test's time): frozen, they are skipped, and
                # collect() walks only what this example made, its dropped loaders included
                gc.freeze()
            self.sampler, self.loader = self.fresh()

        def fresh(self):
            which, kind, workers, (replicas, rank), size, seed = self.cfg
            if which == "packed":
                sampler = PackedBatchSampler(
                    LENGTHS, [16, 32], rows={16: size, 32: 1}, seed=seed, window=9,
                    num_replicas=replicas, rank=rank,
                )  # fmt: skip
            else:
                sampler = BucketBatchSampler(
                    LENGTHS, [4, 8, 16], rows=size, seed=seed,
                    num_replicas=replicas, rank=rank,
                )  # fmt: skip
            cls = DataLoader if kind == "plain" else torchdata.StatefulDataLoader
            extra = {"prefetch_factor": 2} if workers else {}
            loader = cls(
                Indices(), batch_sampler=sampler, collate_fn=as_list, num_workers=workers, **extra
            )
            return sampler, loader

        def expected(self, epoch: int) -> list[list[int]]:
            if epoch not in self.reference:
                ref, _ = self.fresh()
                ref.set_epoch(epoch)
                self.reference[epoch] = list(ref)
            return self.reference[epoch]

        # -- the loop ---------------------------------------------------------------------

        @precondition(lambda self: self.it is None)
        @rule()
        def begin_epoch(self):
            if self.uses_set_epoch:
                self.sampler.set_epoch(self.epoch)
            self.it = iter(self.loader)
            self.got = []
            self.example = False
            self.finished = False

        def step(self) -> bool:
            """One batch of the loop; False once the epoch's batches are all taken."""
            if len(self.got) == len(self.expected(self.epoch)):
                return False
            self.got.append(next(self.it))
            return True

        @precondition(lambda self: self.it is not None)
        @rule(n=st.integers(1, 4))
        def take_batches(self, n):
            for _ in range(n):
                if not self.step():
                    break

        @precondition(
            lambda self: self.it is not None and len(self.got) == len(self.expected(self.epoch))
        )
        @rule(exhaust=st.booleans())
        def end_epoch(self, exhaust):
            """The loop has taken every batch (``islice(loader, len(loader))``), and may or
            may not then see the iterator end: the epoch is over either way."""
            if exhaust:
                assert next(self.it, None) is None, "the epoch has more batches than len()"
            assert self.got == self.expected(self.epoch), f"epoch {self.epoch} differs"
            self.finished = exhaust
            self.epoch += 1
            self.it = None
            self.got = []

        @precondition(lambda self: self.it is not None)
        @rule(exhaust=st.booleans())
        def finish_epoch(self, exhaust):
            while self.step():
                pass
            self.end_epoch(exhaust)

        @precondition(lambda self: self.it is None and (self.uses_set_epoch or not self.cfg[2]))
        @rule()
        def take_an_example_batch(self):
            next(iter(self.loader), None)
            self.example = True
            if not self.uses_set_epoch and len(self.expected(self.epoch)) <= 1:
                # it was the epoch's last batch: the epoch is complete, the loop goes on
                self.epoch += 1
                self.example = False

        # An example batch is a pass like any other: until the next pass begins, the
        # sampler (and a StatefulDataLoader's iterator) counts it as yielded. A plain
        # loader's loop says what it consumed (0); a StatefulDataLoader's state is its
        # iterator's, so it is saved once the next epoch has begun.
        # A StatefulDataLoader with workers restores a state saved after its iterator ended
        # by prefetching the next pass and then discarding it: an epoch that fits in the
        # prefetch is then done for the sampler, which cannot tell that pass from one the
        # loop used. set_epoch every epoch pins the order (the documented recipe).
        @precondition(lambda self: not (self.example and self.cfg[1] == "stateful"))
        @precondition(
            lambda self: (
                not (
                    self.finished
                    and self.cfg[1] == "stateful"
                    and self.cfg[2]
                    and not self.uses_set_epoch
                )
            )
        )
        @rule()
        def save_and_resume(self):
            kind = self.cfg[1]
            if self.it is not None and len(self.got) == len(self.expected(self.epoch)):
                # every batch taken: the epoch is complete, and a loop that counts its
                # steps resumes at the next one
                self.end_epoch(False)
            in_epoch = self.it is not None
            if kind == "plain":
                consumed = len(self.got) if in_epoch else (0 if self.example else None)
                state = self.sampler.state_dict(consumed=consumed)
            else:
                state = self.loader.state_dict()
            self.example = False
            state = roundtrip(state)
            self.it = None  # the old process is gone
            self.sampler, self.loader = self.fresh()
            self.collect()
            (self.sampler if kind == "plain" else self.loader).load_state_dict(state)
            if in_epoch:  # the loop resumes inside the epoch it was in
                if self.uses_set_epoch:
                    self.sampler.set_epoch(self.epoch)
                self.it = iter(self.loader)

        def collect(self):
            """Finalise dropped loaders now: a worker forked later would otherwise inherit
            them and run their shutdown in the child (harmless, but noisy)."""
            if self.cfg[2]:
                gc.collect()

        def teardown(self):
            if hasattr(self, "cfg"):
                self.it = self.loader = self.sampler = None
                self.collect()
                if self.cfg[2]:
                    gc.unfreeze()

        @invariant()
        def consumed_batches_are_a_prefix_of_the_epoch(self):
            if hasattr(self, "cfg"):
                expected = self.expected(self.epoch)
                assert self.got == expected[: len(self.got)], f"epoch {self.epoch} went astray"

    return TrainingLoop


_Fast = loop_machine((0,))
_Fast.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTrainingLoopResumes = _Fast.TestCase

_Slow = loop_machine((0,))
_Slow.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTrainingLoopResumesSlow = pytest.mark.slow(_Slow.TestCase)

# every iter(loader) with workers starts processes (about 5 s an example): fewer examples
_Workers = loop_machine((2,))
_Workers.TestCase.settings = settings(
    max_examples=8,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTrainingLoopResumesWithWorkers = pytest.mark.slow(_Workers.TestCase)

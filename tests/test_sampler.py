import collections
import os
import pickle
import subprocess
import textwrap

import numpy as np
import pytest
from _helpers import build, check_resume_at_every_position, torchrun
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from shapebucket import BucketBatchSampler, BucketCollator, ShapeBucketError
from shapebucket.fit import Buckets
from shapebucket.fit.batches import cut_steps, epoch_batches

BUCKETS = Buckets([4, 8, 16, 32])


@st.composite
def configs(draw):
    lengths = draw(st.lists(st.integers(1, 32), min_size=1, max_size=120))
    by_tokens = draw(st.booleans())
    kwargs = dict(
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        drop_last=draw(st.booleans()),
        leftovers=draw(st.sampled_from(["keep", "promote"])),
    )
    if by_tokens:
        kwargs["tokens_per_batch"] = draw(st.integers(32, 200))
        kwargs["batch_multiple"] = draw(st.sampled_from([1, 2]))
        if kwargs["tokens_per_batch"] // 32 < kwargs["batch_multiple"]:
            kwargs["batch_multiple"] = 1
    else:
        kwargs["rows"] = draw(st.integers(1, 9))
    return np.array(lengths), kwargs


def epoch_union(lengths, kwargs, replicas, epoch=0):
    per_rank = []
    for rank in range(replicas):
        s = build(BucketBatchSampler, lengths, BUCKETS, num_replicas=replicas, rank=rank, **kwargs)
        s.set_epoch(epoch)
        per_rank.append(list(s))
    return per_rank, s.stats


@given(configs(), st.integers(1, 3))
def test_each_index_once_or_counted(cfg, replicas):
    lengths, kwargs = cfg
    per_rank, stats = epoch_union(lengths, kwargs, replicas)
    assert len({len(r) for r in per_rank}) == 1  # same number of batches on every rank
    assert all(len(r) == stats.batches for r in per_rank)
    seen = collections.Counter(i for r in per_rank for b in r for i in b)
    assert sum(seen.values()) == len(lengths) - stats.dropped + stats.duplicated
    assert len(seen) == len(lengths) - stats.dropped
    assert sum(c - 1 for c in seen.values()) == stats.duplicated
    if not kwargs["drop_last"]:
        assert set(seen) == set(range(len(lengths)))
    if replicas == 1:
        assert stats.duplicated == 0
    # all ranks are in the step's bucket at every step; with "promote", a batch made
    # only of promoted samples fits (and is collated to) a smaller bucket
    s = build(BucketBatchSampler, lengths, BUCKETS, num_replicas=replicas, rank=0, **kwargs)
    keys = s.batch_buckets(epoch=0).tolist()
    for step, key in zip(zip(*per_rank, strict=True), keys, strict=True):
        buckets = {BUCKETS.bucket_for(int(lengths[b].max())) for b in step}
        if kwargs["leftovers"] == "keep":
            assert buckets == {key}
        else:
            assert max(buckets) <= key
    for t in range(stats.batches):
        ids = [i for r in per_rank for i in r[t]]
        if len(set(ids)) != len(ids):
            assert stats.duplicated > 0


@given(configs())
def test_batches_fit_smallest_bucket_and_budget(cfg):
    lengths, kwargs = cfg
    s = build(BucketBatchSampler, lengths, BUCKETS, **kwargs)
    collate = BucketCollator(BUCKETS, rows=s.rows, mask_key=None)
    shapes, collated = set(), set()
    for batch, key in zip(s, s.batch_buckets(epoch=0).tolist(), strict=True):
        assert batch
        bucket = BUCKETS.bucket_for(int(lengths[batch].max()))
        smallest = BUCKETS.bucket_for(int(lengths[batch].min()))
        if kwargs["leftovers"] == "keep":
            assert smallest == bucket == key  # no smaller bucket fits all of them
        else:
            assert bucket <= key  # promoted leftovers come from smaller buckets
        if "tokens_per_batch" in kwargs:
            assert len(batch) * key <= kwargs["tokens_per_batch"]
        shapes.add((len(batch), bucket))
        collated.add(tuple(collate([[1] * int(lengths[i]) for i in batch]).shape))
    # paired with rows=sampler.rows, there is one shape per bucket at most
    assert collated <= {(n, b) for b, n in s.rows.items()}
    if kwargs["leftovers"] == "keep":
        assert len(shapes) == s.stats.num_shapes
        used = len(set(BUCKETS.bucket_for_many(lengths).tolist()))
        assert len(shapes) <= (used if kwargs["drop_last"] else 2 * used)


@given(configs(), st.integers(0, 5))
def test_resume_at_every_position(cfg, epoch):
    lengths, kwargs = cfg
    lengths = lengths[:40]
    check_resume_at_every_position(
        lambda: build(BucketBatchSampler, lengths, BUCKETS, **kwargs), epoch
    )


def test_epochs_differ_and_repeat():
    lengths = np.random.default_rng(0).integers(1, 33, 500)
    s = BucketBatchSampler(lengths, BUCKETS, rows=8, seed=3)
    s.set_epoch(1)
    a = list(s)
    s.set_epoch(1)
    assert list(s) == a
    s.set_epoch(2)
    b = list(s)
    assert a != b and sorted(map(sorted, a)) != sorted(map(sorted, b))
    # a full pass completes epoch 1: ``epoch`` is the next one and the state says epoch 1
    # is complete (the loop over it is over); set_epoch pins the order, so another pass
    # repeats epoch 1 (as DistributedSampler), and without set_epoch a full pass moves on
    s.set_epoch(1)
    list(s)
    state = s.state_dict()
    assert s.epoch == 2 and (state["epoch"], state["position"]) == (1, len(a))
    assert s.state_dict(consumed=len(s) - 1)["position"] == len(s) - 1
    assert s.state_dict(consumed=len(s))["position"] == state["num_batches"]  # epoch 1 over
    assert list(s) == a
    unpinned = BucketBatchSampler(lengths, BUCKETS, rows=8, seed=3)
    unpinned.load_state_dict(state)
    assert list(unpinned) == b and unpinned.epoch == 3
    # no global RNG: numpy's global state is untouched and irrelevant
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    s.set_epoch(1)
    assert list(s) == a
    assert (np.random.get_state()[1] == before).all()


def test_abandoned_iterator_skips_nothing():
    lengths = np.random.default_rng(0).integers(1, 33, 100)
    s = BucketBatchSampler(lengths, BUCKETS, rows=8)
    first = next(iter(s))  # e.g. an example batch for prewarm
    full = list(s)
    assert full[0] == first and len(full) == len(s)
    assert sorted(i for b in full for i in b) == list(range(100))


def test_unshuffled_is_sorted_and_deterministic():
    lengths = np.array([9, 3, 3, 30, 5, 9, 2])
    s = BucketBatchSampler(lengths, BUCKETS, rows=2, shuffle=False)
    assert list(s) == [[1, 2], [6], [4], [0, 5], [3]]
    assert s.batch_buckets().tolist() == [4, 4, 8, 16, 32]


def test_promote_and_drop_counts():
    lengths = np.array([3] * 5 + [7] * 3 + [20] * 2)
    keep = BucketBatchSampler(lengths, BUCKETS, rows=4, shuffle=False)
    assert keep.stats.short_batches == 3 and keep.stats.num_shapes == 4
    promote = BucketBatchSampler(lengths, BUCKETS, rows=4, shuffle=False, leftovers="promote")
    assert [len(b) for b in promote] == [4, 4, 2] and promote.stats.promotions == 1
    drop = BucketBatchSampler(lengths, BUCKETS, rows=4, shuffle=False, drop_last=True)
    assert list(drop) == [[0, 1, 2, 3]] and drop.stats.dropped == 6


def test_max_tokens_batch_sizes_and_collator_pairing():
    lengths = np.random.default_rng(1).integers(1, 33, 300)
    s = BucketBatchSampler.for_tokens(lengths, BUCKETS, 64, batch_multiple=2)
    assert s.rows == {4: 16, 8: 8, 16: 4, 32: 2}
    collate = BucketCollator(BUCKETS, rows=s.rows)
    shapes = {tuple(collate([[1] * int(lengths[i]) for i in b])[0].shape) for b in s}
    assert shapes <= {(16, 4), (8, 8), (4, 16), (2, 32)}


@pytest.mark.parametrize(
    "args, kwargs, needle",
    [
        ([[3, 0, 4]], {"rows": 2}, "sample 1 has length 0"),
        ([[3, -2]], {"rows": 2}, "sample 1 has length -2"),
        ([[3, 40]], {"rows": 2}, r"sample 1 has length 40 > largest bucket 32"),
        ([[3]], {"rows": None}, "rows must be an int"),
        ([[3]], {"rows": {4: 2}}, r"no batch size for buckets \[8, 16, 32\]"),
        ([[3]], {"rows": {**dict.fromkeys(BUCKETS, 2), 5: 1}}, r"names \[5\]"),
        ([[3]], {"tokens_per_batch": 31}, "tokens_per_batch=31 .* use tokens_per_batch >= 32"),
        ([[3]], {"tokens_per_batch": 40, "batch_multiple": 2}, "use tokens_per_batch >= 64"),
        ([[3]], {"rows": 0}, "rows must be >= 1, got 0"),
        ([[3]], {"rows": 2, "num_replicas": 2, "rank": 2}, "rank 2 is not < num_replicas 2"),
        ([[3]], {"rows": 2, "leftovers": "merge"}, "'merge'"),
        ([[]], {"rows": 2}, "lengths is empty"),
        ([[3.5]], {"rows": 2}, "dtype float64"),
        # a string is true in Python: drop_last="no" dropped samples, shuffle="no" shuffled
        ([[3]], {"rows": 2, "drop_last": "no"}, "drop_last must be True or False, got 'no'"),
        ([[3]], {"rows": 2, "shuffle": "no"}, "shuffle must be True or False, got 'no'"),
        ([[3]], {"rows": 2, "drop_last": 0}, "drop_last must be True or False, got 0"),
    ],
)
def test_bad_input(args, kwargs, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        build(BucketBatchSampler, *args, BUCKETS, **kwargs)


def test_state_from_other_config_is_refused():
    a = BucketBatchSampler([3, 5, 9], BUCKETS, rows=2)
    b = BucketBatchSampler([3, 5, 9], BUCKETS, rows=1)
    with pytest.raises(ShapeBucketError, match="other lengths, buckets"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ShapeBucketError, match="no 'fingerprint'"):
        b.load_state_dict({"epoch": 0, "position": 0, "seed": 0})


def test_pickles():
    s = BucketBatchSampler(np.arange(1, 33), BUCKETS, rows=3, seed=5)
    assert list(pickle.loads(pickle.dumps(s))) == list(s)


class Lengths(Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"input_ids": [i] * int(self.lengths[i])}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers(method):
    lengths = np.random.default_rng(2).integers(1, 33, 100)
    sampler = BucketBatchSampler(lengths, BUCKETS, rows=8, seed=1)
    collate = BucketCollator(BUCKETS, rows=8)
    want = [
        b["input_ids"]
        for b in DataLoader(Lengths(lengths), batch_sampler=sampler, collate_fn=collate)
    ]
    sampler.set_epoch(0)
    got = [
        b["input_ids"]
        for b in DataLoader(
            Lengths(lengths),
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=2,
            multiprocessing_context=method,
        )
    ]
    assert len(got) == len(want) == len(sampler)
    assert all((a == b).all() for a, b in zip(got, want, strict=True))


DIST_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch.distributed as dist
    from shapebucket import BucketBatchSampler
    from shapebucket.fit import Buckets

    dist.init_process_group("gloo")
    lengths = np.random.default_rng(0).integers(1, 33, 203)
    s = BucketBatchSampler(lengths, Buckets([4, 8, 16, 32]), rows=5, seed=7)  # world and rank from torch.distributed
    s.set_epoch(1)
    batches = list(s)
    buckets = [int(Buckets([4, 8, 16, 32]).bucket_for(int(lengths[b].max()))) for b in batches]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, {"rank": dist.get_rank(), "world": s.num_replicas, "batches": batches, "buckets": buckets, "dup": s.stats.duplicated})
    if dist.get_rank() == 0:
        json.dump(out, open(sys.argv[1], "w"))
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_process_gloo(tmp_path):
    script = tmp_path / "dist_sampler.py"
    script.write_text(DIST_SCRIPT)
    out = tmp_path / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = torchrun(script, out)
    subprocess.run(cmd, check=True, env=env, timeout=240, capture_output=True)
    import json

    r0, r1 = json.loads(out.read_text())
    assert r0["world"] == r1["world"] == 2
    assert len(r0["batches"]) == len(r1["batches"]) > 0
    assert r0["buckets"] == r1["buckets"]  # same bucket at every step
    ids0 = collections.Counter(i for b in r0["batches"] for i in b)
    ids1 = collections.Counter(i for b in r1["batches"] for i in b)
    assert set(ids0) | set(ids1) == set(range(203))
    total = ids0 + ids1
    # ranks are disjoint except for the counted repeats that even out short steps
    assert sum(c - 1 for c in total.values()) == r0["dup"] == r1["dup"]


def test_settings_are_read_only_once_built():
    s = BucketBatchSampler([3, 5, 9, 12, 4], BUCKETS, rows=2)
    before = list(s)
    for name, value in [
        ("drop_last", True),
        ("leftovers", "promote"),
        ("buckets", Buckets([32])),
        ("shuffle", False),
        ("seed", 1),
        ("epoch", 3),
    ]:
        with pytest.raises(AttributeError, match=f"{name} is fixed"):
            setattr(s, name, value)
    with pytest.raises(ValueError, match="read-only"):
        s.lengths[0] = 30
    s.set_epoch(0)
    assert list(s) == before and "drop_last=False" in repr(s)
    sizes = s.rows
    sizes[4] = 99  # a copy: the batches are not changed through it
    assert s.rows[4] == 2


@given(configs(), st.integers(1, 3), st.integers(0, 3))
def test_batch_functions_alone_give_the_samplers_batches(cfg, replicas, epoch):
    """cut_steps + epoch_batches, called directly, reproduce what the sampler yields."""
    lengths, kwargs = cfg
    s = build(BucketBatchSampler, lengths, BUCKETS, num_replicas=replicas, rank=0, **kwargs)
    sizes = [s.rows[b] for b in BUCKETS]
    steps = cut_steps(
        np.bincount(s.bucket_index, minlength=len(BUCKETS)),
        sizes,
        num_replicas=replicas,
        drop_last=kwargs["drop_last"],
        leftovers=kwargs["leftovers"],
    )
    assert steps.stats == s.stats
    order = epoch_batches(
        steps,
        s.bucket_index,
        seed=kwargs["seed"],
        epoch=epoch,
        shuffle=kwargs["shuffle"],
        num_replicas=replicas,
    )
    want = [
        order.flat[o : o + n].tolist()
        for o, n in zip(order.offsets.tolist(), order.sizes.tolist(), strict=True)
    ]
    s.set_epoch(epoch)
    assert list(s) == want
    assert all(
        sizes[b] >= n for b, n in zip(order.buckets.tolist(), order.sizes.tolist(), strict=True)
    )


def test_drop_last_warns_when_whole_buckets_are_never_seen():
    lengths = np.r_[np.full(100, 3), np.full(5, 30)]  # the 5 longest fill less than a batch
    with pytest.warns(UserWarning, match=r"drops every sample of bucket\(s\) \[32\] \(5 samples"):
        s = BucketBatchSampler(lengths, BUCKETS, rows=8, drop_last=True)
    assert max(lengths[i] for b in s for i in b) == 3  # indeed never seen
    whole = np.r_[np.full(96, 3), np.full(5, 30)]  # no leftover to promote: promote cannot help
    with pytest.warns(UserWarning, match="Pass drop_last=False"):
        BucketBatchSampler(whole, BUCKETS, rows=8, drop_last=True, leftovers="promote")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a bucket that loses only its remainder: no warning
        BucketBatchSampler(
            np.r_[np.full(100, 3), np.full(9, 30)], BUCKETS, rows=8, drop_last=True
        )


def test_the_readmes_pad_row_figures_on_a_small_long_tailed_dataset():
    """Issue 39 item 20: the quick start on 2,000 samples computed 39% padding, mostly
    all-pad rows: fit_buckets does not count the rows that rows= adds to each bucket's
    short last batch, and on a small dataset a long bucket holds less than one batch.
    The README gives these figures and the two remedies; this pins them."""
    import shapebucket

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(4.5, 0.8, 2000).astype(int), 1, 1024).tolist()
    buckets = shapebucket.fit_buckets(lengths, k=8, align=8)

    def padding(rows, leftovers="keep"):
        s = BucketBatchSampler(lengths, buckets, rows=rows, leftovers=leftovers, shuffle=False)
        computed = sum(rows * b for b in s.batch_buckets())
        in_rows = sum((rows - len(i)) * b for i, b in zip(s, s.batch_buckets(), strict=True))
        pad = computed - sum(lengths)
        return round(100 * pad / computed), round(100 * in_rows / pad)

    assert padding(64) == (40, 63)  # most of the padding is pad rows
    assert padding(16)[0] == 25 and padding(64, "promote")[0] == 35

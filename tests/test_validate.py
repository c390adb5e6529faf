"""One validation path: every public entry point that takes a dataset's lengths gives the
same answer to the same bad input, and the same answer to the same good lengths in any
container (list, tuple, numpy array or tensor of any int dtype); old argument names are gone."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import (
    BucketBatchSampler,
    BucketCollator,
    ShapeBucketError,
    fit_buckets,
    fit_packing,
)
from shapebucket._lengths import check_lengths
from shapebucket._validate import check_int
from shapebucket.advise.policies import compare_policies
from shapebucket.data import read_lengths
from shapebucket.fit.buckets import Buckets
from shapebucket.fit.padding import padding_report

ENTRY_POINTS = {
    "fit_buckets": lambda x: fit_buckets(x, 2),
    "padding_report": lambda x: padding_report(x, [8, 2**31]),
    "compare_policies": lambda x: compare_policies(x, 2),
    "BucketBatchSampler": lambda x: BucketBatchSampler(x, [8, 2**31], rows=2),
    "check_lengths": check_lengths,
}

BAD = [
    ([3.0, 5.0, 1.0], "must be integers, got dtype float64"),
    ([3, 5, 0], "sample 2 has length 0; lengths must be >= 1"),
    ([3, -2], "sample 1 has length -2"),
    ([[3, 4], [5, 6]], r"must be 1-D .* got shape \(2, 2\)"),
    ([], "lengths is empty"),
    (np.array([True, False]), "dtype bool"),
    (lambda: (n for n in [3, 4]), "got generator; pass list"),
    ({3, 4}, "got set"),
    ([3, "4"], "must be integers"),
    (np.array([3, None], dtype=object), r"index 1 is None"),
    ([3, 2**70], r"lengths\[1\] is 1180591620717411303424, which does not fit in int64"),
    (np.array([3, 2**63], dtype=np.uint64), "does not fit in int64"),
    (7, "got int"),
    ("3 4", "got a string"),
]


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("value, needle", BAD, ids=[str(i) for i in range(len(BAD))])
def test_every_entry_point_answers_bad_lengths_alike(entry, value, needle):
    if callable(value):  # a generator is made afresh for each entry point
        value = value()
    with pytest.raises(ShapeBucketError, match=needle):
        ENTRY_POINTS[entry](value)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_accepts_the_same_good_lengths(entry):
    for value in (
        [3, 5, 9],
        np.array([3, 5, 9], dtype=np.int32),
        torch.tensor([3, 5, 9]),
        range(3, 6),
    ):
        ENTRY_POINTS[entry](value)


def test_check_lengths_never_aliases_or_changes_the_input():
    arr = np.array([3, 5], dtype=np.int64)
    sampler = BucketBatchSampler(arr, [8], rows=1)
    arr[0] = 100  # the sampler owns a copy: its plan cannot change under it
    assert sampler.lengths.tolist() == [3, 5] and not sampler.lengths.flags.writeable


@pytest.mark.parametrize(
    "value, needle",
    [
        (True, "must be an int"),
        (2.0, "must be an int"),
        ("3", "must be an int"),
        (0, ">= 1, got 0"),
        (9, "<= 8, got 9"),
    ],
)
def test_check_int(value, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        check_int("k", value, minimum=1, maximum=8)
    assert check_int("k", np.int32(3), minimum=1) == 3


def test_read_lengths_checks_like_the_rest(tmp_path):
    (tmp_path / "ok.txt").write_text("3\n5\n")
    assert read_lengths(tmp_path / "ok.txt").tolist() == [3, 5]
    cases = {
        "empty.txt": ("", "is empty"),
        "neg.txt": ("3\n--5\n", "line 2: '--5' is not an int"),
        "zero.txt": ("3\n0\n", "sample 1 has length 0"),
        "bin.txt": (b"\xff\xfe\x00", "not a text file"),
    }
    for name, (content, needle) in cases.items():
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        with pytest.raises(ShapeBucketError, match=needle):
            read_lengths(path)
    np.save(tmp_path / "obj.npy", np.array([3, "x"], dtype=object))
    np.save(tmp_path / "float.npy", np.array([3.0, 4.0]))
    (tmp_path / "corrupt.npy").write_bytes(b"\x93NUMPY garbage")
    for name, needle in [
        ("obj.npy", "not a readable .npy"),
        ("float.npy", "dtype float64"),
        ("corrupt.npy", "not a readable"),
    ]:
        with pytest.raises(ShapeBucketError, match=needle):
            read_lengths(tmp_path / name)
    with pytest.raises(ShapeBucketError, match="is not a file"):
        read_lengths(tmp_path)


def test_old_argument_names_are_gone():
    for call in (
        lambda: fit_buckets([3, 9], 1, sampler="random"),
        lambda: padding_report([3, 9], [8, 16], sampler="random"),
        lambda: compare_policies([3, 9], 1, sampler="bucketed"),
        lambda: BucketCollator([8], pad_batch_to=3),
    ):
        with pytest.raises(TypeError, match="sampler|pad_batch_to"):
            call()
    assert not hasattr(padding_report([3, 9], [8, 16]), "sampler")


def test_one_align_default():
    lengths = [3, 5, 9, 30, 31]
    assert fit_buckets(lengths, 3) == fit_buckets(lengths, 3, align=8)
    assert compare_policies(lengths, 3).fitted == fit_buckets(lengths, 3)


# -- inputs that used to cost time, memory or a raw error ----------------------------------


def test_policy_table_costs_the_same_whatever_the_longest_length():
    import time

    base = np.random.default_rng(0).integers(1, 300, 5000)
    t0 = time.perf_counter()
    compare_policies(base)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    table = compare_policies(np.r_[base, 10**8])  # used to take 28 s and 1.3 GB
    outlier = time.perf_counter() - t0
    assert outlier < 10 * plain + 1.0
    # the multiples policies list the multiples samples pad to, the outlier's included
    multiples = table.policies[0][1].buckets
    assert multiples.max_len == 10**8 and len(multiples) <= 40


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: Buckets([2**40]), r"bucket 0 is 1099511627776 > 2147483648 \(2\*\*31\)"),
        (lambda: fit_buckets([3, 2**40], k=2), r"sample 1 has length 1099511627776 > 1073741824"),
        (
            lambda: BucketCollator([8, 2**31])([[1] * 9] * 4),
            "a batch of 4 rows at bucket 2147483648 needs about",
        ),
    ],
)
def test_absurd_lengths_are_refused_before_any_allocation(call, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        call()


# -- one answer whatever the container ---------------------------------------------------

NUMPY_INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
TORCH_INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


def containers(values):
    """The same ints as a list, a tuple, numpy arrays and tensors of several int dtypes."""
    out = {"list": list(values), "tuple": tuple(values)}
    out |= {f"numpy {d.__name__}": np.asarray(values, dtype=d) for d in NUMPY_INTS}
    out |= {f"torch {d}": torch.tensor(values, dtype=d) for d in TORCH_INTS}
    return out


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 120), min_size=1, max_size=60),
    k=st.integers(1, 4),
    batching=st.sampled_from(["bucketed", "random"]),
)
def test_every_container_of_the_same_lengths_gives_the_same_answer(lengths, k, batching):
    forms = containers(lengths)
    buckets = sorted({max(2, x) for x in lengths} | {120})  # fits every int dtype
    tokens = 4 * 120
    # fit_packing reads the container once, in the shared check, before its search; a
    # search over 3 or 4 row lengths costs up to a second a call (16 calls an example)
    # and shows nothing more about containers than one over 1 or 2
    pack_k = min(k, 2)
    want = {
        "fit_buckets": fit_buckets(lengths, k, batching=batching, batch_size=4),
        "padding_report": padding_report(lengths, buckets, batching=batching).to_dict(),
        "fit_packing": fit_packing(lengths, pack_k, tokens_per_batch=tokens),
        "Buckets": Buckets(buckets),
    }
    for name, x in forms.items():
        got = {
            "fit_buckets": fit_buckets(x, k, batching=batching, batch_size=4),
            "padding_report": padding_report(x, buckets, batching=batching).to_dict(),
            "fit_packing": fit_packing(x, pack_k, tokens_per_batch=tokens),
        }
        for entry, value in got.items():
            assert value == want[entry], (entry, name)
        for form, b in containers(buckets).items():
            assert Buckets(b) == want["Buckets"], form
            assert padding_report(x, b).to_dict() == padding_report(lengths, buckets).to_dict()


def test_lengths_are_checked_once_at_the_public_edge(monkeypatch):
    """An entry point checks the lengths once and passes them on checked
    (:class:`CheckedLengths`): ``choose_k`` checked the same lengths 97 times before
    (every K's fit and padding report)."""
    from shapebucket import _lengths
    from shapebucket.advise import choose_k

    calls = []
    real = _lengths._as_array
    monkeypatch.setattr(_lengths, "_as_array", lambda x, name: calls.append(1) or real(x, name))
    lengths = np.random.default_rng(0).integers(1, 300, 2_000).tolist()
    entry_points = {
        "choose_k": lambda: choose_k(
            lengths, compile_seconds=10, job_samples=10**6, tokens_per_second=4e4
        ),
        "compare_policies": lambda: compare_policies(lengths, 4),
        "fit_packing": lambda: fit_packing(lengths, 4, tokens_per_batch=1024),
    }
    counts = {}
    for name, call in entry_points.items():
        calls.clear()
        call()
        counts[name] = len(calls)
    assert counts == dict.fromkeys(entry_points, 1)


def test_checked_lengths_cannot_change_after_the_check():
    from shapebucket._lengths import CheckedLengths

    arr = np.array([3, 5, 9])
    checked = CheckedLengths.of(arr)
    arr[0] = -1  # the caller's array: the checked copy is not it
    assert checked.array.tolist() == [3, 5, 9] and not checked.array.flags.writeable
    with pytest.raises(ValueError):
        checked.array[0] = -1
    assert CheckedLengths.of(checked) is checked
    with pytest.raises(ShapeBucketError, match="sample 0 has length 0"):
        CheckedLengths.of([0, 3])


@pytest.mark.parametrize(
    "rows, needle",
    [
        ({"8": 2, 16: 1}, r"has no batch size for buckets \[8\] and names \['8'\]"),
        ({8.0: 2, 16: 1}, r"names \[8\.0\], which are not buckets of \[8, 16\]"),
        ({(8, 16): 2, 16: 1}, r"has no batch size for buckets \[8\] and names \[\(8, 16\)\]"),
    ],
)
def test_rows_mapping_names_the_wrong_key(rows, needle):
    """A typo'd key (a string, a float, a cell for a bucket) is named, never accepted as
    the bucket it equals, for the samplers and the collators alike."""
    for make in (
        lambda: BucketBatchSampler([3, 9], [8, 16], rows=rows),
        lambda: BucketCollator([8, 16], rows=rows),
    ):
        with pytest.raises(ShapeBucketError, match=needle):
            make()


def test_an_int_past_the_float_range_is_refused_as_not_finite():
    """Probe: ``choose_k(compile_seconds=10**400)`` raised a raw OverflowError from
    ``float(value)``; ``job_samples=10**400`` overflowed in the estimate."""
    from shapebucket._validate import check_number
    from shapebucket.advise import choose_k

    with pytest.raises(ShapeBucketError, match="x must be a finite number > 0, got 1000"):
        check_number("x", 10**400, above=0)
    good = {"compile_seconds": 1.0, "job_samples": 10, "tokens_per_second": 1e3}
    for key, needle in [
        ("compile_seconds", "compile_seconds must be a finite number > 0"),
        ("tokens_per_second", "tokens_per_second must be a finite number > 0"),
        ("job_samples", "job_samples must be <= 9007199254740992"),
    ]:
        with pytest.raises(ShapeBucketError, match=needle):
            choose_k([5, 9, 30], **{**good, key: 10**400})

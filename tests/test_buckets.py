import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shapebucket import ShapeBucketError
from shapebucket.fit import Buckets

bucket_sets = st.lists(st.integers(2, 10_000), min_size=1, max_size=20, unique=True).map(sorted)


@given(bucket_sets, st.data())
def test_bucket_for_is_smallest_bucket_that_fits(lengths, data):
    b = Buckets(lengths)
    length = data.draw(st.integers(0, b.max_len))
    got = b.bucket_for(length)
    assert got >= length
    assert got in lengths
    assert all(x < length for x in lengths if x < got)


@given(bucket_sets, st.data())
def test_bucket_for_many_agrees_with_bucket_for(lengths, data):
    b = Buckets(lengths)
    xs = data.draw(st.lists(st.integers(0, b.max_len), max_size=50))
    many = b.bucket_for_many(np.array(xs, dtype=np.int64))
    assert many.tolist() == [b.bucket_for(x) for x in xs]


def test_edge_rule_boundary_lands_in_its_bucket():
    b = Buckets([8, 16])
    assert [b.bucket_for(x) for x in (0, 7, 8, 9, 16)] == [8, 8, 8, 16, 16]


def _check_constructed(b, align=1):
    xs = list(b)
    assert xs == sorted(set(xs))
    assert all(x >= 2 and x % align == 0 for x in xs)


@given(st.integers(1, 64), st.integers(2, 5000), st.one_of(st.none(), st.integers(1, 5000)))
def test_multiples(of, max_len, min_len):
    if min_len is not None and min_len > max_len:
        with pytest.raises(ShapeBucketError, match=str(min_len)):
            Buckets.multiples(of, max_len, min_len)
        return
    b = Buckets.multiples(of, max_len, min_len)
    _check_constructed(b, of)
    assert b.max_len >= max_len and b.max_len - max_len < of
    assert all(y - x == of for x, y in zip(b.lengths, b.lengths[1:], strict=False))
    if min_len is not None:
        assert b[0] >= min_len and (b[0] - of < max(min_len, 2))


@given(st.integers(2, 100_000), st.integers(2, 64))
def test_powers_of_two(max_len, min_len):
    if min_len > max_len:
        return
    b = Buckets.powers_of_two(max_len, min_len)
    _check_constructed(b)
    assert all(x & (x - 1) == 0 for x in b)
    assert b.max_len >= max_len and b.max_len < 2 * max_len
    assert b[0] >= min_len and b[0] < 2 * min_len


@given(
    st.integers(2, 500), st.integers(2, 20_000), st.floats(1.01, 4.0), st.sampled_from([1, 8, 32])
)
def test_geometric(min_len, max_len, ratio, align):
    if min_len > max_len:
        return
    b = Buckets.geometric(min_len, max_len, ratio, align)
    _check_constructed(b, align)
    assert b.max_len >= max_len and b.max_len - max_len < align
    assert b[0] >= min_len


def test_value_semantics_and_pickle():
    a, b = Buckets([8, 16]), Buckets((8, 16))
    assert a == b and hash(a) == hash(b) and a != Buckets([8, 32])
    assert Buckets([8]) < Buckets([16])
    assert list(a) == [8, 16] and len(a) == 2 and 8 in a and a.lengths == (8, 16)
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == "Buckets([8, 16])"
    assert eval(repr(a)) == a
    with pytest.raises(AttributeError):
        a._lengths = (1,)


@pytest.mark.parametrize(
    "arg, needle",
    [
        ([], "empty"),
        ([16, 8], "8 follows 16"),
        ([8, 8], "8 appears twice"),
        ([8, 1], "got 1"),
        ([0], "got 0"),
        ([8.0], "8.0"),
        ([True, 8], "True"),
        (["8"], "'8'"),
        ("816", "'816'"),
        (8, "8"),
    ],
)
def test_invalid_buckets(arg, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        Buckets(arg)


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: Buckets.multiples(0, 64), "of must be >= 1, got 0"),
        (lambda: Buckets.multiples(-8, 64), "got -8"),
        (lambda: Buckets.multiples(8, 16, min_len=32), r"min_len \(32\)"),
        (lambda: Buckets.powers_of_two(64, min_len=128), r"min_len \(128\)"),
        (lambda: Buckets.powers_of_two(64, min_len=1), "got 1"),
        (lambda: Buckets.geometric(8, 64, ratio=1.0), "got 1.0"),
        (lambda: Buckets.geometric(8, 64, ratio=0.5), "got 0.5"),
        (lambda: Buckets.geometric(8, 64, ratio=float("nan")), "nan"),
        (lambda: Buckets.geometric(100, 64, ratio=2), r"min_len \(100\)"),
        (lambda: Buckets.geometric(8, 64, ratio=2, align=0), "got 0"),
    ],
)
def test_invalid_constructor_args(call, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        call()


def test_overflow_and_bad_lengths():
    b = Buckets([8, 16])
    with pytest.raises(ShapeBucketError, match=r"length 17 > largest bucket 16.*add a bucket"):
        b.bucket_for(17)
    with pytest.raises(ShapeBucketError, match="got -1"):
        b.bucket_for(-1)
    with pytest.raises(ShapeBucketError, match="index 2.*length 40"):
        b.bucket_for_many(np.array([3, 4, 40, 50]))
    with pytest.raises(ShapeBucketError, match="sample 1 has length -3"):
        b.bucket_for_many(np.array([3, -3]))
    with pytest.raises(ShapeBucketError, match="float"):
        b.bucket_for_many(np.array([3.0]))


def test_the_fitting_layer_reads_no_compiler_state():
    """``shapebucket.fit`` is pure: no module of it imports torch or ``_torch``
    (``Buckets.check_limit`` read dynamo's config; it is ``compile.check_recompile_limit``,
    tested in tests/test_compile.py)."""
    import ast
    from pathlib import Path

    import shapebucket.fit

    wrong = []
    for path in Path(shapebucket.fit.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(a.name for a in node.names)]
            else:
                continue
            if any(
                n.split(".")[0] == "torch" or n.split(".")[-1] == "_torch" or "._torch." in n
                for n in names
            ):
                wrong.append(f"{path.name}:{node.lineno}")
    assert wrong == []

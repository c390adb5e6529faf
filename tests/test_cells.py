"""Two-length buckets: the cell table and its fit (fit/cells.py, fit/cell_fit.py)."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket.errors import ShapeBucketError
from shapebucket.fit import Cells, cells_report, fit_cells
from shapebucket.fit.cell_fit import cells_lower_bound

FAST = settings(max_examples=40, deadline=None, print_blob=True)


def true_cost(cells, s, t, w=(1, 1)):
    """Padded tokens with each sample in its cheapest containing cell (None: one fits none)."""
    total = 0
    for a, b in zip(s, t, strict=True):
        fits = [w[0] * S + w[1] * T for S, T in cells if a <= S and b <= T]
        if not fits:
            return None
        total += min(fits)
    return total


def hierarchical_cost(cells, s, t, w=(1, 1)):
    """Padded tokens with each sample in its own source strip (None: it fits none there)."""
    sources = sorted({S for S, _ in cells})
    total = 0
    for a, b in zip(s, t, strict=True):
        S = next((x for x in sources if x >= a), None)
        targets = [T for SS, T in cells if SS == S and b <= T]
        if S is None or not targets:
            return None
        total += w[0] * S + w[1] * min(targets)
    return total


def brute_force(s, t, k, w=(1, 1)):
    """(best any-table cost, best hierarchical-table cost) over every <= k cells of the grid."""
    grid = list(itertools.product(sorted(set(np.maximum(s, 2))), sorted(set(np.maximum(t, 2)))))
    best_any = best_hier = None
    for r in range(1, k + 1):
        for cells in itertools.combinations(grid, r):
            c, h = true_cost(cells, s, t, w), hierarchical_cost(cells, s, t, w)
            if c is not None and (best_any is None or c < best_any):
                best_any = c
            if h is not None and (best_hier is None or h < best_hier):
                best_hier = h
    return best_any, best_hier


lengths = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=8)


@FAST
@given(pairs=lengths, k=st.integers(1, 3), w=st.sampled_from([(1, 1), (1, 3), (2, 1)]))
def test_fit_is_the_best_hierarchical_table_and_within_the_bounds(pairs, k, w):
    s = np.array([a * 3 for a, _ in pairs])
    t = np.array([b * 2 for _, b in pairs])
    cells = fit_cells(s, t, k, align=1, weights=w)
    best_any, best_hier = brute_force(s, t, k, w)
    cost = true_cost(cells.cells, s, t, w)
    assert len(cells) <= k and cells.weights == w
    assert cells_lower_bound(s, t, k, align=1, weights=w) <= best_any <= cost <= best_hier


@FAST
@given(
    pairs=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=60),
    k=st.integers(1, 9),
    align=st.sampled_from([1, 8, (16, 4)]),
)
def test_fit_cells_are_aligned_used_and_cover_every_sample(pairs, k, align):
    s, t = np.array(pairs).T
    cells = fit_cells(s, t, k, align=align, grid=16)
    a_s, a_t = align if isinstance(align, tuple) else (align, align)
    assert 1 <= len(cells) <= k
    assert all(S % a_s == 0 and T % a_t == 0 for S, T in cells)
    report = cells_report(cells, s, t)  # raises if a sample fits no cell
    assert report.num_shapes == len(cells)  # every cell receives samples
    assert report.num_samples == len(s)
    assert 0 < report.token_efficiency <= 1


def test_one_cell_is_the_longest_of_each_side_and_more_cells_pad_less():
    rng = np.random.default_rng(0)
    s = rng.integers(1, 500, 2000)
    t = (s * rng.uniform(0.5, 1.5, len(s))).astype(int) + 1
    assert fit_cells(s, t, 1) == Cells([(504, int(-(-t.max() // 8) * 8))])
    shares = [cells_report(fit_cells(s, t, k), s, t).token_efficiency for k in (1, 2, 4, 8)]
    assert shares == sorted(shares) and shares[-1] > shares[0]
    bound = (s.sum() + t.sum()) / cells_lower_bound(s, t, 8)
    assert shares[-1] <= bound


def test_edge_rule_cheapest_cell_ties_to_the_smaller_source():
    cells = Cells([(32, 8), (8, 32), (16, 64)])
    assert cells.cell_for(8, 8) == (8, 32)  # 40 = 40: the smaller source
    assert cells.cell_for(9, 8) == (32, 8)
    assert cells.cell_for(16, 33) == (16, 64)
    assert cells.cell_for(8, 32) == (8, 32)  # a length equal to a boundary lands in it
    assert cells.index_for_many([9, 8], [8, 8]).tolist() == [2, 0]


def test_a_batch_of_one_cell_has_its_longest_in_that_cell():
    rng = np.random.default_rng(1)
    s, t = rng.integers(1, 100, 500), rng.integers(1, 100, 500)
    cells = fit_cells(s, t, 6)
    index = cells.index_for_many(s, t)
    for j in np.unique(index).tolist():
        members = index == j
        top = (int(s[members].max()), int(t[members].max()))
        assert cells.cell_for(*top) == cells.cells[j]


def test_cells_value_semantics():
    a = Cells([(16, 8), (8, 16)])
    assert a.cells == ((8, 16), (16, 8)) and a == Cells([(8, 16), (16, 8)])
    assert hash(a) == hash(Cells(a)) and pickle.loads(pickle.dumps(a)) == a
    assert (8, 16) in a and len(a) == 2 and a.max_source == 16 and a.max_target == 16
    with pytest.raises(AttributeError):
        a.foo = 1  # type: ignore[attr-defined]
    heavy = Cells(a, weights=(1, 4))
    assert heavy != a and heavy.weights == (1, 4) and Cells(heavy).weights == (1, 4)
    assert pickle.loads(pickle.dumps(heavy)) == heavy and "weights=(1, 4)" in repr(heavy)
    assert a.cell_for(4, 4) == (8, 16) and heavy.cell_for(4, 4) == (16, 8)


@pytest.mark.parametrize(
    "bad, match",
    [
        ([], "at least one"),
        ([(8, 8), (8, 8)], "twice"),
        ([(8,)], "pair"),
        ([(1, 8)], "source"),
        ("88", "pairs"),
    ],
)
def test_bad_cells_are_refused(bad, match):
    with pytest.raises(ShapeBucketError, match=match):
        Cells(bad)
    with pytest.raises(ShapeBucketError, match="target weight"):
        Cells([(8, 8)], weights=(1, 0))


def test_a_sample_that_fits_no_cell_is_named_with_the_limit_and_the_fix():
    cells = Cells([(16, 8), (32, 4)])
    with pytest.raises(ShapeBucketError) as e:
        cells.index_for_many([3, 20], [2, 6])
    msg = str(e.value)
    assert "sample 1" in msg and "source length 20 and target length 6" in msg
    assert "longest target of the cells with source >= 20 is 4" in msg and "fit_cells" in msg


def test_fit_takes_align_as_an_int_or_a_pair():
    # a list pair was read as one int for both sides and refused ("must be an int")
    assert fit_cells([3, 9], [5, 7], k=2, align=[8, 16]) == fit_cells(  # type: ignore[arg-type]
        [3, 9], [5, 7], k=2, align=(8, 16)
    )


def test_fit_refuses_bad_input():
    with pytest.raises(ShapeBucketError, match="2 source lengths and 1 target"):
        fit_cells([3, 4], [5])
    with pytest.raises(ShapeBucketError, match="k"):
        fit_cells([3], [5], k=0)
    with pytest.raises(
        ShapeBucketError, match=r"align must be an int or a \(source, target\) pair"
    ):
        fit_cells([3], [5], align=(8, 8, 8))  # type: ignore[arg-type]
    with pytest.raises(ShapeBucketError, match="sample 0 has length 0; sources"):
        fit_cells([0], [5])
    with pytest.raises(ShapeBucketError, match="targets"):
        fit_cells([3], ["x"])
    with pytest.raises(ShapeBucketError, match=f"source weight must be <= {2**30}"):
        fit_cells([3], [5], weights=(2**40, 1))


def test_a_huge_k_is_the_most_cells_that_help_not_a_hang():
    rng = np.random.default_rng(1)
    s, t = rng.integers(1, 200, 300), rng.integers(1, 100, 300)
    many = fit_cells(s, t, k=10**9)
    pairs = {(-(-a // 8) * 8, -(-b // 8) * 8) for a, b in zip(s.tolist(), t.tolist(), strict=True)}
    assert many == fit_cells(s, t, k=len(pairs)) and len(many) <= len(pairs)
    assert (
        cells_report(many, s, t).token_efficiency
        >= cells_report(fit_cells(s, t), s, t).token_efficiency
    )

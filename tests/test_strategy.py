"""The strategy chosen from the job: choose_strategy, its time model, time_steps, suggest --model-dim."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket.__main__ import main
from shapebucket.advise import StepTiming, choose_strategy, time_steps
from shapebucket.advise.jobtime import ShapeLoad, compile_while_training, job_seconds
from shapebucket.data import mixture_lengths
from shapebucket.errors import ShapeBucketError

TIMING = StepTiming(
    compile_seconds=9.0, eager_seconds=0.04, compiled_seconds=0.032, rows=48, length=32
)

# -- the time model ------------------------------------------------------------------------------


def test_compile_while_training_by_hand():
    # two shapes: A (30 batches) 60 s eager / 30 s compiled, B (10 batches) 40 s / 20 s
    loads = [ShapeLoad(10, 40.0, 20.0), ShapeLoad(30, 60.0, 30.0)]
    # A first (most batches), ready at 10 s: 10 s of a 100 s job = 10%;
    # then 30 + 40 = 70 s per job until 20 s: 10 s = 1/7; the rest at 50 s per job
    done = 0.1 + 10 / 70
    warm, job = compile_while_training(loads, 10.0)
    assert warm == 20.0 and job == pytest.approx(20 + (1 - done) * 50)
    assert job_seconds("eager", loads, 10.0) == (0.0, 100.0, 100.0)
    assert job_seconds("compile-first", loads, 10.0) == (20.0, 50.0, 70.0)
    # contention: steps run twice as slow while compiling
    _, slow = compile_while_training(loads, 10.0, contention=2.0)
    done = 10 / 200 + 10 / 140
    assert slow == pytest.approx(20 + (1 - done) * 50)
    # loading each compiled shape pauses training a second
    _, paused = compile_while_training(loads, 10.0, load_seconds=1.0)
    done = 0.1 + 9 / 70  # the second compile overlaps the first load
    assert paused == pytest.approx(21 + (1 - done) * 50)
    # a job shorter than the first compile never sees a compiled step
    assert compile_while_training([ShapeLoad(1, 5.0, 1.0)], 10.0)[1] == 5.0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 100), st.floats(0.01, 1e4), st.floats(0.01, 1.0)),
        min_size=1,
        max_size=8,
    ),
    st.floats(0.01, 1e3),
)
def test_compiling_in_the_background_sits_between_the_ceiling_and_eager(shapes, compile_s):
    loads = [ShapeLoad(b, e, e * f) for b, e, f in shapes]  # compiled never slower
    warm, job = compile_while_training(loads, compile_s)
    eager_job = job_seconds("eager", loads, compile_s)[1]
    compiled_only = job_seconds("compile-first", loads, compile_s)[1]
    assert compiled_only * (1 - 1e-9) <= job <= eager_job * (1 + 1e-9)
    assert job <= warm + compiled_only + 1e-6 * job  # never worse than compiling first


# -- choose_strategy -----------------------------------------------------------------------------

small_jobs = st.tuples(
    st.lists(st.integers(1, 60), min_size=5, max_size=80),
    st.floats(0.5, 100),  # compile seconds
    st.floats(1e-3, 1.0),  # eager step seconds
    st.floats(0.2, 1.5),  # compiled / eager
    st.integers(1, 10**6),  # job samples
)


def _timing(compile_s: float, step: float, ratio: float) -> StepTiming:
    return StepTiming(
        compile_seconds=compile_s,
        eager_seconds=step,
        compiled_seconds=step * ratio,
        rows=8,
        length=32,
    )


@settings(max_examples=25, deadline=None, print_blob=True)
@given(small_jobs)
def test_never_compiles_when_the_job_is_shorter_than_a_compile(job):
    lengths, compile_s, step, ratio, samples = job
    report = choose_strategy(
        lengths, _timing(compile_s, step, ratio), model_dim=64, job_samples=samples, k=3
    )
    fastest_eager = min(e.job_seconds for e in report.options if e.mode == "eager")
    if fastest_eager <= compile_s:
        assert report.chosen.mode == "eager", str(report)
    if ratio >= 1:  # compiling does not make a step faster: nothing to win back
        assert report.chosen.mode == "eager", str(report)
    # equal to 9 digits is a tie that goes to the simpler mode (eager by 1 ulp here)
    best = min(e.job_seconds for e in report.options)
    assert report.chosen.job_seconds == pytest.approx(best, rel=1e-9)
    assert str(report).count("<- chosen") == 1


@settings(max_examples=20, deadline=None, print_blob=True)
@given(small_jobs, st.integers(2, 100))
def test_estimates_grow_with_the_job(job, factor):
    lengths, compile_s, step, ratio, samples = job
    timing = _timing(compile_s, step, ratio)
    small = choose_strategy(lengths, timing, model_dim=64, job_samples=samples, k=3)
    large = choose_strategy(lengths, timing, model_dim=64, job_samples=samples * factor, k=3)
    before = {(e.layout, e.mode): e.job_seconds for e in small.options}
    for e in large.options:
        assert e.job_seconds >= before[(e.layout, e.mode)] * (1 - 1e-9)
    assert large.chosen.job_seconds >= small.chosen.job_seconds * (1 - 1e-9)


def test_short_and_long_jobs_on_the_mixture():
    lengths = mixture_lengths(20_000)
    short = choose_strategy(lengths, TIMING, model_dim=128, job_samples=2_000)
    assert short.chosen.mode == "eager" and "warm-up costs more" in short.reason
    long = choose_strategy(lengths, TIMING, model_dim=128, job_samples=2_000_000)
    assert long.chosen.mode == "compile-while-training" and long.chosen.layout == "packing"
    assert long.token_efficiency >= 0.97 and long.num_shapes <= 8
    # a busy machine (steps twice as slow while compiling, compiles three times as slow in
    # the background, a second to load each) makes compiling first pay
    busy_timing = dataclasses.replace(
        TIMING, contention=2.0, background_compile_seconds=27.0, load_seconds=1.0
    )
    busy = choose_strategy(lengths, busy_timing, model_dim=128, job_samples=2_000_000)
    assert busy.chosen.mode == "compile-first", str(busy)
    assert "warm-up is won back" in busy.reason
    text = str(long)
    assert "recommended: packed rows" in text and "note: every time is estimated" in text
    assert {(e.layout, e.mode) for e in long.options} == {
        (layout, mode)
        for layout in ("buckets", "packing")
        for mode in ("eager", "compile-first", "compile-while-training")
    }
    assert long.to_dict()["chosen"]["mode"] == "compile-while-training"


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: choose_strategy([3, 5], "fast", model_dim=8, job_samples=10), "timing must be a"),
        (
            lambda: choose_strategy([3, 5], TIMING, model_dim=0, job_samples=10),
            "model_dim must be >= 1",
        ),
        (
            lambda: choose_strategy([3, 5], TIMING, model_dim=8, job_samples=0),
            "job_samples must be",
        ),
        (
            lambda: dataclasses.replace(TIMING, contention=0.5),
            r"contention must be a finite number >= 1, got 0.5 \(a background compile never",
        ),
        (lambda: dataclasses.replace(TIMING, load_seconds=-1), "load_seconds must be a finite"),
        (
            lambda: dataclasses.replace(TIMING, background_compile_seconds=True),
            "background_compile_seconds must be a number > 0, got True",
        ),
        (
            lambda: StepTiming(
                compile_seconds=-1, eager_seconds=1, compiled_seconds=1, rows=1, length=8
            ),
            "compile_seconds must be a finite number > 0",
        ),
        (
            lambda: StepTiming(
                compile_seconds=1, eager_seconds=1, compiled_seconds=1, rows=0, length=8
            ),
            "rows must be >= 1",
        ),
        (lambda: time_steps(print, print, [1, 2]), "cannot read the batch's shape"),
        (
            lambda: choose_strategy([3, 5], TIMING, model_dim=8, job_samples=9, align=0),
            "align must be >= 1, got 0",
        ),
    ],
)
def test_bad_arguments(call, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        call()


def test_time_steps_calls_each_step_and_reads_the_shape():
    calls = {"eager": 0, "compiled": 0, "sync": 0}

    def step(name):
        def run(batch):
            calls[name] += 1

        return run

    batch = {"input_ids": np.zeros((6, 40)), "labels": np.zeros((6, 40))}
    timing = time_steps(
        step("eager"),
        step("compiled"),
        batch,
        repeats=4,
        sync=lambda: calls.update(sync=calls["sync"] + 1),
    )
    assert (timing.rows, timing.length) == (6, 40)
    assert calls == {"eager": 5, "compiled": 5, "sync": 20}
    assert timing.compile_seconds > 0 and timing.eager_seconds > 0
    assert time_steps(step("eager"), step("compiled"), None, rows=2, length=8).rows == 2


# -- suggest --model-dim -----------------------------------------------------------------------------

STEP = ["--compile-seconds", "9", "--step-seconds", "0.04", "--compiled-step-seconds", "0.032"]


def test_suggest_model_dim_prints_the_strategy(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(5_000))
    argv = ["suggest", str(path), "--model-dim", "128", "--job-samples", "2000000", *STEP]
    assert main([*argv, "--step-shape", "48x32"]) == 0
    out = capsys.readouterr().out
    assert "strategy from the job: 2,000,000 samples" in out and out.count("<- chosen") == 1
    assert "recommended: " in out and "buckets = shapebucket.fit.Buckets([" in out


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--model-dim", "128", "--job-samples", "10", *STEP], "missing: --step-shape"),
        (["--step-seconds", "0.1"], "--step-seconds describe the timed step"),
        (["--model-dim", "128", "--k", "auto"], "--model-dim chooses the shapes from the job"),
        (["--model-dim", "128", "--tokens-per-second", "5"], "--model-dim chooses the shapes"),
    ],
)
def test_suggest_model_dim_refuses_in_one_line(tmp_path, capsys, flags, needle):
    path = tmp_path / "lengths.npy"
    np.save(path, mixture_lengths(500))
    assert main(["suggest", str(path), *flags]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: ") and needle in line and captured.out == ""


def test_a_huge_eager_step_never_gives_a_negative_job():
    # eager 1e20 s against compiled 0.03 s: adding and subtracting the shapes' seconds
    # one by one cancelled to a negative job time
    timing = StepTiming(
        compile_seconds=20, eager_seconds=1e20, compiled_seconds=0.03, rows=48, length=32
    )
    lengths = np.random.default_rng(0).integers(1, 300, 500)
    report = choose_strategy(lengths, timing, model_dim=128, job_samples=1000)
    assert all(e.train_seconds > 0 and e.job_seconds > 0 for e in report.estimates)
    loads = [ShapeLoad(10.0 * i, 1e20 * i, 0.03 * i) for i in range(1, 7)]
    _, job = compile_while_training(loads, 20.0)
    assert job >= sum(s.compiled_seconds for s in loads)


def test_estimates_that_overflow_are_refused():
    timing = StepTiming(
        compile_seconds=20, eager_seconds=1e308, compiled_seconds=0.03, rows=48, length=32
    )
    with pytest.raises(ShapeBucketError, match="eager_seconds=1e\\+308"):
        choose_strategy([3, 5, 200], timing, model_dim=128, job_samples=1000)


def test_measured_step_cost_replaces_the_formula_and_the_report_says_so():
    """Issue 31: the job-time model takes step times measured per length (a StepCost)
    instead of ``1 + L/(6d)``. A StepCost equal to the formula gives the formula's
    estimates; one where long rows cost much more moves the choice away from them."""
    from shapebucket.advise.jobtime import unit_cost
    from shapebucket.fit import StepCost

    lengths = mixture_lengths(4_000)  # 6..255 tokens
    timing = StepTiming(
        compile_seconds=5, eager_seconds=0.2, compiled_seconds=0.1, rows=8, length=256
    )
    grid = [8, 64, 128, 256]
    formula = StepCost({L: 1 + L / (6 * 64) for L in grid}, source="the formula, as a table")
    for L in (8, 100, 256):  # linear between grid points: exact on them, close between
        assert unit_cost(3, L, formula) == pytest.approx(
            unit_cost(3, L, 64) / (1 + 8 / (6 * 64)), rel=1e-2
        )
    by_formula = choose_strategy(lengths, timing, model_dim=64, job_samples=10**6)
    by_table = choose_strategy(lengths, timing, model_dim=formula, job_samples=10**6)
    assert by_table.chosen.layout == by_formula.chosen.layout
    assert by_table.chosen.mode == by_formula.chosen.mode
    assert by_table.chosen.job_seconds == pytest.approx(by_formula.chosen.job_seconds, rel=0.02)
    assert "the formula, as a table" in by_table.notes[0] and "(the formula)" in by_formula.notes[0]
    assert "step cost measured at lengths [8, 64, 128, 256]" in str(by_table)
    assert by_table.to_dict()["model_dim"] is None and by_table.to_dict()["step_cost"][256] > 0
    # the measured cost shapes the row lengths: when a token costs the same in any row,
    # long rows (fewer shapes, less padding) win; when long rows cost 20x per token, rows
    # are cut close to the samples, more of them
    flat = StepCost({8: 1.0, 256: 1.0})
    steep = StepCost({8: 1.0, 64: 1.0, 128: 4.0, 256: 20.0})
    rows = {}
    for name, cost in (("flat", flat), ("steep", steep)):
        report = choose_strategy(lengths, timing, model_dim=cost, job_samples=10**6)
        (packed,) = [e for e in report.options if (e.layout, e.mode) == ("packing", "eager")]
        rows[name] = list(packed.buckets)
    assert len(rows["flat"]) < len(rows["steep"]), rows
    assert np.mean(rows["flat"]) > np.mean(rows["steep"]), rows


@pytest.mark.parametrize(
    "model_dim, match",
    [
        (0, "model_dim must be >= 1"),  # was ZeroDivisionError
        (-16, "model_dim must be >= 1"),  # was a cost of 0 (or below)
        ("16", "model_dim must be an int"),  # was TypeError
        ({64: 1e-6}, r"model_dim must be an int .* or a StepCost"),  # was TypeError
        (True, "model_dim must be an int"),  # was taken as a width of 1
        (16.0, "model_dim must be an int"),
    ],
)
def test_unit_cost_checks_model_dim(model_dim, match):
    """Probe 2: ``unit_cost`` (public in ``advise.jobtime``) took any ``model_dim``."""
    from shapebucket.advise.jobtime import Rates, unit_cost

    with pytest.raises(ShapeBucketError, match=match):
        unit_cost(2, 96, model_dim)
    with pytest.raises(ShapeBucketError, match=match):
        Rates(1.0, 1.0, model_dim).load(2, 96, 1)
    assert unit_cost(2, 96, np.int64(16)) == 384.0

"""K from the job: the bucket count that minimises estimated prewarm plus training."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket.__main__ import main
from shapebucket.advise.kchoice import choose_k
from shapebucket.data import mixture_lengths
from shapebucket.errors import ShapeBucketError
from shapebucket.fit.optimal import fit_buckets

# measured on this project's CPU (docs/benchmarks.md, mixture): 8 buckets of the bench
# GPT compile in 89-119 s, and the step computes about 41,700 tokens/s
COMPILE_S, RATE = 12.5, 41_700
MIXTURE = mixture_lengths(50_000, seed=0)


def test_an_hour_long_job_buys_many_buckets_and_a_short_one_few():
    hour = int(3600 * RATE * 0.85 / MIXTURE.mean())  # samples an hour of training covers
    long = choose_k(
        MIXTURE, compile_seconds=COMPILE_S, job_samples=hour, tokens_per_second=RATE, align=1
    )
    assert long.chosen.k > 8 and long.chosen.token_efficiency >= 0.93
    short = choose_k(
        MIXTURE, compile_seconds=COMPILE_S, job_samples=300 * 64, tokens_per_second=RATE, align=1
    )
    assert short.chosen.k <= 3
    text = str(long)
    assert (
        text.count("<- chosen") == 1 and "above the recompile limit" in text and "prewarm" in text
    )
    assert fit_buckets(MIXTURE, long.chosen.k, align=1) == long.buckets


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=300),
    st.floats(0.1, 100),
    st.integers(1, 10**7),
    st.floats(1e3, 1e6),
)
def test_the_chosen_k_has_the_shortest_estimated_job(lengths, compile_s, samples, rate):
    choice = choose_k(
        lengths, compile_seconds=compile_s, job_samples=samples, tokens_per_second=rate
    )
    jobs = [r.job_seconds for r in choice.candidates]
    assert choice.chosen.job_seconds == min(jobs)
    ks = [r.k for r in choice.candidates]
    assert ks == sorted(set(ks))  # one row per K, growing, stopping when K changes nothing
    mean = float(np.mean(lengths))
    for r in choice.candidates:
        assert r.prewarm_seconds == pytest.approx(r.k * compile_s)
        assert r.train_seconds == pytest.approx(samples * mean / r.token_efficiency / rate)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (
            {"compile_seconds": -1, "job_samples": 10, "tokens_per_second": 1e4},
            "compile_seconds must be a finite number > 0",
        ),
        (
            {"compile_seconds": 1, "job_samples": 10, "tokens_per_second": "fast"},
            "tokens_per_second must be a number > 0",
        ),
        (
            {"compile_seconds": 1, "job_samples": 0, "tokens_per_second": 1e4},
            "job_samples must be >= 1",
        ),
    ],
)
def test_bad_job_arguments(kwargs, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        choose_k([3, 5, 9], **kwargs)


def test_fit_buckets_takes_an_int_k_and_names_choose_k_for_the_job():
    # k="auto" was a second route to K (beside choose_k); it is gone
    for k in ("auto", "eight"):
        with pytest.raises(ShapeBucketError, match=r"k must be an int >= 1.*advise\.choose_k"):
            fit_buckets([3, 5, 9], k)
    with pytest.raises(TypeError):
        fit_buckets([3, 5, 9], 2, compile_seconds=1.0)  # type: ignore[call-arg]


def test_suggest_prints_the_k_table(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, MIXTURE)
    argv = ["suggest", str(path), "--k", "auto", "--align", "1"]
    argv += ["--compile-seconds", "12.5", "--job-samples", "19200", "--tokens-per-second", "41700"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "K from the job: 19,200 samples" in out and "<- chosen" in out
    chosen = next(line for line in out.splitlines() if "<- chosen" in line)
    assert int(chosen.split()[0]) <= 3

"""``--profile gpu``: the settings it makes, checked without a run, and one small run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shapebucket.bench import cli
from shapebucket.bench.profiles import PROFILES, sized
from shapebucket.bench.workloads import load_workload, long_mixture_lengths
from shapebucket.errors import ShapeBucketError


def resolved(*argv: str):
    args = cli._parser().parse_args(list(argv))
    cli._resolve(args)
    return args


def test_gpu_profile_sets_real_step_sizes():
    args = resolved("--profile", "gpu")
    assert (args.model_dim, args.depth, args.heads, args.max_len) == (1024, 4, 16, 2048)
    assert args.tokens_per_step >= 16_384 and args.workload == "long-mixture"
    # every strategy at the same tokens a step
    assert args.bucket_tokens_per_batch == args.packed_tokens_per_batch == args.tokens_per_step
    lengths = load_workload("long-mixture", n=args.samples, max_len=2048, seed=0)[0]
    assert abs(args.batch_size * lengths.mean() - args.tokens_per_step) < lengths.mean()
    peers = {"grouped-dynamic", "grouped-mark-dynamic", "fixed-packed-compile"}
    assert peers <= set(args.strategies) and "shapebucket-packed" in args.strategies
    assert args.json == "results/profile_gpu.json"


def test_gpu_profile_quick_is_reduced_and_keeps_given_settings():
    args = resolved("--profile", "gpu", "--quick", "--depth", "2")
    quick = sized(PROFILES["gpu"].sizes, quick=True)
    assert args.model_dim == quick["model_dim"] and args.depth == 2
    assert args.tokens_per_step == quick["tokens_per_step"] < 16_384
    assert args.json == "results/profile_gpu_quick.json"


def test_tokens_per_step_below_a_row_is_refused():
    with pytest.raises(ShapeBucketError, match="--tokens-per-step"):
        resolved("--profile", "gpu", "--tokens-per-step", "1000")


def test_long_mixture_is_long_tailed_up_to_max_len():
    lengths = long_mixture_lengths(50_000, max_len=2048, seed=1)
    assert lengths.min() >= 16 and lengths.max() == 2048
    assert np.median(lengths) <= 128 and (lengths > 512).mean() == pytest.approx(0.05, abs=0.01)


def test_gpu_profile_quick_runs_and_records_the_profile(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["--profile", "gpu", "--quick", "--no-limit", "--epoch-samples", "60"]
    argv += ["--strategies", "grouped-eager,shapebucket-packed-eager", "--json", str(out)]
    assert cli.main([*argv, "--plot", ""]) == 0
    data = json.loads(out.read_text())
    assert data["config"]["profile"]["name"] == "gpu" and data["config"]["profile"]["quick"]
    assert data["config"]["tokens_per_step"] == PROFILES["gpu"].sizes["tokens_per_step"][1]
    assert all(r["steps_per_sec"] > 0 for r in data["results"])
    printed = capsys.readouterr().out
    assert "profile gpu (quick)" in printed and "steps/s: " in printed


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_rows_budget_must_be_positive(value):
    with pytest.raises(ShapeBucketError, match="--rows-budget-mb"):
        resolved("--profile", "gpu", "--quick", "--rows-budget-mb", value)


def test_calibrated_rows_fit_the_stated_budget():
    from shapebucket.bench import harness
    from shapebucket.bench.batching import epoch_batches

    args = resolved("--profile", "gpu", "--quick", "--samples", "2000", "--rows-budget-mb", "3")
    s = harness._setup(args)
    epoch_batches("calibrated", s)
    assert s.calibrated.budget == 3 * 2**20
    assert all(peak <= s.calibrated.budget for peak in s.calibrated.peak.values())


def test_the_workload_is_loaded_once(monkeypatch):
    """The grouped peers' batch at --tokens-per-step, the packing budget and the run itself
    read one load of the lengths (the profile's batch size loaded them a second time)."""
    from shapebucket.bench import harness

    calls = []
    real = cli.load_workload
    monkeypatch.setattr(cli, "load_workload", lambda *a, **k: calls.append(a) or real(*a, **k))
    args = resolved("--profile", "gpu", "--quick", "--samples", "2000")
    s = harness._setup(args)
    assert len(calls) == 1 and len(s.lengths) == 2000
    assert args.batch_size == max(1, round(args.tokens_per_step / float(s.lengths.mean())))

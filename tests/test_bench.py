import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from shapebucket import BucketCollator
from shapebucket.bench import cli, harness
from shapebucket.bench.harness import SAME_BATCHES, STRATEGIES, StrategyResult
from shapebucket.bench.report import check_losses, format_table
from shapebucket.bench.workloads import load_workload, stdlib_docstring_lengths

REQUIRED = {
    "name",
    "steps_per_sec",
    "useful_tokens_per_sec",
    "warmup_s",
    "graphs",
    "timed_recompiles",
    "recompile_limit_hit",
    "token_efficiency",
    "peak_mem_mb",
    "final_loss",
}


def bench(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "shapebucket", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_quick_run_writes_table_json_and_plot(tmp_path):
    out = bench(
        "--quick",
        "--cache",
        "shared",
        "--json",
        str(tmp_path / "r.json"),
        "--plot",
        str(tmp_path / "r.png"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["config"]["torch"] and data["config"]["batch_size"] == 16
    names = [r["name"] for r in data["results"]]
    assert names == list(STRATEGIES[:8])
    for r in data["results"]:
        assert r["error"] is None, r
        assert r.keys() >= REQUIRED
        assert r["steps_per_sec"] > 0 and 0 < r["token_efficiency"] <= 1
    by = {r["name"]: r for r in data["results"]}
    assert (
        by["shapebucket"]["timed_recompiles"] == 0
        and by["shapebucket-random"]["timed_recompiles"] == 0
    )
    assert by["shapebucket"]["token_efficiency"] > by["eager-longest"]["token_efficiency"]
    assert by["eager-max"]["graphs"] == 0 and by["static-max"]["graphs"] >= 1
    assert "loss check:" in out.stdout and "vs best" in out.stdout
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_loss_check_fails_when_the_padding_mask_is_broken(monkeypatch, capsys):
    common = [
        "--quick",
        "--strategies",
        "eager-max,eager-longest",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--json",
        "",
        "--plot",
        "",
    ]
    assert cli.main(common) == 0
    assert "agree at every step" in capsys.readouterr().out

    real_plan = harness._plan

    def broken_plan(name, setup):
        batches, collate, buckets = real_plan(name, setup)
        if name == "eager-longest":  # pad tokens count in the loss and are attended to
            collate = BucketCollator(collate.buckets, pad_values={"labels": 0}, mask_key=None)
        return batches, collate, buckets

    monkeypatch.setattr(harness, "_plan", broken_plan)
    assert cli.main(common) == 1
    err = capsys.readouterr().err
    assert "disagree on the loss" in err and "eager-longest: step 0" in err


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this project's machines)"
)
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_quick_run_on_gpu(tmp_path, mode):
    out = bench(
        "--quick",
        "--device",
        "cuda",
        "--mode",
        mode,
        "--json",
        str(tmp_path / "r.json"),
        "--plot",
        "",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert all(r["error"] is None for r in results)


def test_check_losses_unit():
    a = StrategyResult("eager-max", losses=[5.0, 4.0, 3.0])
    b = StrategyResult("static-max", losses=[5.0, 4.0001, 3.0])
    c = StrategyResult("dynamic-true", losses=[5.0, 4.5, 3.0])
    other = StrategyResult("shapebucket", losses=[1.0, 1.0, 1.0])  # different batches: not compared
    assert check_losses([a, b, other]) == []
    problems = check_losses([a, b, c])
    assert len(problems) == 1 and problems[0].startswith("dynamic-true: step 1")
    assert "shapebucket" not in SAME_BATCHES
    table = format_table(
        [
            StrategyResult("static-max", useful_tokens_per_sec=10.0),
            StrategyResult("shapebucket", useful_tokens_per_sec=25.0),
        ]
    )
    assert "2.50x" in table


def test_workloads():
    text = stdlib_docstring_lengths()
    assert len(text) > 1000 and text.min() >= 2
    lengths, clipped = load_workload("text", n=0, max_len=256, seed=0)
    assert lengths.max() <= 256 and clipped == int((text > 256).sum())
    mix, clipped = load_workload("mixture", n=1000, max_len=256, seed=0)
    assert len(mix) == 1000 and clipped == 0 and mix.min() >= 6 and mix.max() <= 256
    assert np.array_equal(mix, load_workload("mixture", n=1000, max_len=256, seed=0)[0])

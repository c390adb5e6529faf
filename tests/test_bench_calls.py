"""``benchmarks/bucketed_calls.py`` runs, small: its host-time mode in this process, a
stream through every strategy (eager backend) in a subprocess. No timing is asserted:
speed never goes in tests; what is checked is what the tables are made of."""

import json
import os
import runpy
import sys
from pathlib import Path

import pytest
from _helpers import run_scaled

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bucketed_calls.py"


def test_host_time_measures_the_wrapper_and_the_bare_module_for_both_calls(tmp_path, capsys):
    out = tmp_path / "host.json"
    ns = runpy.run_path(str(SCRIPT))
    ns["main"](["--host-time", "--host-calls", "5", "--host-warm", "1", "--json", str(out)])
    rows = json.loads(out.read_text())["host_time"]
    assert [(r["call"], r["what"]) for r in rows] == [
        ("1 x 8", "bare module"),
        ("1 x 8", "BucketedModel"),
        ("1 x 8", "packed"),
        ("1 x 8", "graphs: emulated replay (CPU)"),
        ("16 x 24", "bare module"),
        ("16 x 24", "BucketedModel"),
        ("16 x 24", "packed"),
        ("16 x 24", "packed, fresh lengths"),
        ("16 x 24", "graphs: emulated replay (CPU)"),
    ]
    assert all(r["calls"] == 5 and 0 < r["median_us"] <= r["p99_us"] for r in rows)
    assert "| 1 x 8 | BucketedModel |" in capsys.readouterr().out


def test_unknown_streams_and_strategies_are_refused(capsys):
    ns = runpy.run_path(str(SCRIPT))
    for args, name in [(["--stream", "huge"], "streams"), (["--strategies", "x"], "strategies")]:
        with pytest.raises(SystemExit):
            ns["parse"](args)
        assert f"unknown {name}" in capsys.readouterr().err


@pytest.mark.slow  # compiles (eager backend) four strategies in a subprocess: ~40 s
def test_a_small_stream_runs_every_strategy_and_the_wrapper_compiles_nothing_in_it(tmp_path):
    out = tmp_path / "calls.json"
    args = [sys.executable, SCRIPT, "--backend", "eager", "--calls", "3", "--rounds", "2"]
    args += ["--warm-calls", "3", "--k", "2", "--row-k", "2", "--json", out]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_scaled(args, 300, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]["small/eval"]
    assert list(results) == [
        "dynamic",
        "compile",
        "reduce-overhead",
        "bucketed",
        "bucketed-packed",
        "bucketed-packed-one",
    ]
    for r in results.values():
        assert len(r["tokens_per_s"]) == 2 and len(r["latency_s"]) == 6
        assert 0 < r["tokens_real"] <= r["tokens_run"]
    # the same fresh calls reach every strategy: the same real tokens
    assert len({r["tokens_real"] for r in results.values()}) == 1
    for name in ("bucketed", "bucketed-packed", "bucketed-packed-one"):
        assert results[name]["graphs_stream"] == 0  # prewarmed: nothing compiled mid-stream
        assert results[name]["fit"].startswith("CallShapes: buckets ")
    # packing runs fewer tokens than padding the same calls to the same shapes
    assert results["bucketed-packed"]["tokens_run"] < results["bucketed"]["tokens_run"]
    assert "| bucketed |" in done.stdout
    # the wrapper's own CUDA graphs need CUDA: skipped on a CPU, with the reason
    assert "skipped bucketed-graphs, bucketed-packed-graphs: CUDA graphs" in done.stderr

"""Every example under docs/examples runs here on CPU, small, and fails the suite if it breaks:
in this process as ``python example.py ...`` would run it (``run_here``), or in processes of
its own where that is what it shows (two ranks under torchrun; tests/test_hf.py's two runs
sharing a compile cache)."""

import json
import os
import runpy
import sys
from pathlib import Path

import pytest
from _helpers import run_scaled, torchrun

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
pytestmark = pytest.mark.slow


def run(args, timeout=600):
    """``args`` in a subprocess; ``timeout`` is the limit on a quiet machine, scaled by the
    load (``tests/_helpers.py``: a timeout names the load and how to raise it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_scaled(args, timeout, capture_output=True, text=True, env=env)


def run_here(script, args, monkeypatch, capsys) -> str:
    """``python script args`` run in this process (its ``__main__`` block, ``sys.argv`` set):
    the example runs end to end as pasted without paying a new interpreter's imports of torch
    and transformers. With a fresh compiler (the ``fresh_compiler`` fixture), one torch
    thread (as ``OMP_NUM_THREADS=1`` gave the subprocess) and ``os.environ`` restored after it.
    Fails on a non-zero exit; returns its stdout."""
    monkeypatch.setattr(sys, "argv", [str(script), *map(str, args)])
    env = dict(os.environ)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exited:
        if exited.code not in (None, 0):
            pytest.fail(
                f"{script.name} exited with {exited.code!r}:\n{capsys.readouterr().err[-3000:]}"
            )
    finally:
        os.environ.clear()
        os.environ.update(env)
    return capsys.readouterr().out


def last_json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def usage_error(script, args, monkeypatch, capsys) -> str:
    """``script``'s ``main()`` run in this process with ``args`` (an argument error needs no
    interpreter of its own): it exits with argparse's usage status 2; returns its stderr."""
    ns = runpy.run_path(str(script))  # defines main(); __name__ is not "__main__"
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    with pytest.raises(SystemExit) as exited:
        ns["main"]()
    err = capsys.readouterr().err
    assert exited.value.code == 2, err[-2000:]
    return err


def test_train_loop(monkeypatch, capsys, fresh_compiler):
    out = run_here(EXAMPLES / "train_loop.py", ["12"], monkeypatch, capsys)
    assert "step  11" in out
    assert "training: 0 graphs compiled, 0 recompiles" in out


def test_ddp_two_ranks_same_steps_no_recompile(tmp_path):
    cmd = torchrun(EXAMPLES / "ddp.py", 6, tmp_path)
    out = run(cmd)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 6
    assert all(
        r["train_graphs"] == 0 and r["recompiles"] == 0 and r["prewarm_graphs"] > 0 for r in ranks
    )


def test_hf_trainer_buckets_with_torch_compile(monkeypatch, capsys, fresh_compiler):
    pytest.importorskip("transformers")
    # dynamo's bookkeeping with the eager backend; tests/test_hf.py runs the example
    # with inductor (packed) in its own interpreters and checks that its second run loads
    # the compile cache
    args = ["8", "--k", "2", "--backend", "eager"]
    result = last_json(run_here(EXAMPLES / "hf_trainer.py", args, monkeypatch, capsys))
    assert result["steps"] == 8
    used = {int(b) for b in result["batches_per_bucket"]}
    assert used <= set(result["buckets"]) and sum(result["batches_per_bucket"].values()) >= 8
    # one static graph (or more, per graph break) for every bucket seen, never the recompile limit
    assert result["limit_hits"] == 0 and result["graphs"] >= len(used)


def test_hf_trainer_no_compile_trains_eagerly(monkeypatch, capsys, fresh_compiler):
    """``--no-compile`` (benchmarks/first_step_hf.py's eager baseline): no graph, no prewarm;
    a backend given alone would turn compiling on (TrainingArguments), so none is passed."""
    pytest.importorskip("transformers")
    args = ["2", "--k", "2", "--no-compile"]
    result = last_json(run_here(EXAMPLES / "hf_trainer.py", args, monkeypatch, capsys))
    assert result["steps"] == 2
    assert (result["graphs"], result["prewarm_shapes"], result["prewarm_seconds"]) == (0, 0, 0.0)


def test_serve_variable_batches_without_recompiling(monkeypatch, capsys, fresh_compiler):
    out = run_here(EXAMPLES / "serve.py", ["40", "--backend", "eager"], monkeypatch, capsys)
    assert "prewarm: 9 graphs for 3 lengths x 3 batch sizes" in out
    assert "in 40 batches: 0 graphs compiled, 0 recompiles" in out


@pytest.mark.parametrize(
    "args, match",
    [
        (["0"], "steps: must be >= 1, got 0"),  # max_steps=0: the Trainer ran 3 whole epochs
        (["-5"], "steps: must be >= 1, got -5"),
        (["2", "--k", "0"], "--k: must be >= 1, got 0"),  # was taken as the default k
        (["2", "--no-compile", "--backend", "eager"], "--backend .* --no-compile"),  # ignored
    ],
)
def test_hf_trainer_refuses_bad_arguments(args, match, monkeypatch, capsys):
    """Probe 2: these ran (or trained for minutes) instead of a usage error."""
    import re

    pytest.importorskip("transformers")
    err = usage_error(EXAMPLES / "hf_trainer.py", args, monkeypatch, capsys)
    assert re.search(match, err), err[-2000:]


@pytest.mark.parametrize(
    "args, match",
    [
        (["--runs", "0"], "--runs: must be >= 1, got 0"),  # was statistics.StatisticsError
        (["--plan", "packed"], "--plan: .packed. is not layout:how"),  # was ValueError
        (["--plan", "packed:hot"], "'hot' .* eager, cold, warm"),  # ran as a cold run
        (["--plan", "rows:cold"], "'rows' .* packed, buckets"),  # was KeyError, mid-run
        (["--plan", "buckets:warm"], "buckets:warm needs buckets:cold"),  # ran cold
    ],
)
def test_first_step_hf_refuses_a_bad_plan_before_running(
    args, match, tmp_path, monkeypatch, capsys
):
    import re

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "first_step_hf.py"
    err = usage_error(script, ["--out", str(tmp_path / "o"), *args], monkeypatch, capsys)
    assert re.search(match, err), err[-2000:]
    assert not (tmp_path / "o").exists()  # nothing started

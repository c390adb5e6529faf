import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shapebucket

ROOT = Path(__file__).resolve().parents[1]


def test_all_is_sorted_and_every_public_name_has_an_example():
    assert list(shapebucket.__all__) == sorted(shapebucket.__all__)
    missing = [
        n
        for n in shapebucket.__all__
        if ">>>" not in (inspect.getdoc(getattr(shapebucket, n)) or "")
    ]
    assert missing == []


def test_api_docs_are_built_from_the_docstrings():
    # the reference documents shapebucket.hf, which needs transformers to import
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_api_docs.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's package, also in a worktree
    )
    assert out.returncode == 0, out.stderr
    text = (ROOT / "docs" / "api.md").read_text()
    assert all(f"## `{name}`" in text for name in shapebucket.__all__)
    for module in ("fit", "plan", "advise", "sampling", "collate", "compile", "calibrate", "hf", "hf.trl"):
        names = importlib.import_module(f"shapebucket.{module}").__all__
        extra = [n for n in names if n not in shapebucket.__all__]
        assert extra and all(f"## `shapebucket.{module}.{n}`" in text for n in extra), module
    # the records a function returns leave __all__ but stay in the reference
    for path in ("shapebucket.fit.packing.PackingReport", "shapebucket.compile.report.PrewarmReport"):
        assert f"## `{path}`" in text, path


def test_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/test.sh" in readme and "bash scripts/bench.sh" in readme
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_the_saved_benchmark_runs_replay(tmp_path, capsys):
    """docs/benchmarks.md: ``--from-json FILE`` prints a run saved in docs/img/ again. A
    field the benchmark drops must leave them readable (dropping compile-while-training's
    ``background`` and ``warmup_curve`` made every one of them fail to load)."""
    from shapebucket.bench import cli

    for name in ("steps_per_sec_text.json", "gpu_h200_bench_w256.json"):
        path = ROOT / "docs" / "img" / name
        assert cli.main(["--from-json", str(path), "--plot", str(tmp_path / "r.png")]) == 0, (
            capsys.readouterr().err
        )

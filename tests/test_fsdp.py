"""FSDP2 (``fully_shard``) on 2 CPU processes (gloo) with packed batches: docs/examples/fsdp.py
against its single-process twin (the same global batches on one process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import torchrun

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "fsdp.py"
STEPS = 6
pytestmark = pytest.mark.slow


def test_fsdp_two_ranks_match_one_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["--steps", STEPS, "--out", tmp_path]
    # both at once: each spends much of its time starting up and compiling
    runs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for cmd in (
            torchrun(EXAMPLE, *args),
            [sys.executable, str(EXAMPLE), "--single", "--world", "2", *map(str, args)],
        )
    ]
    for p in runs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"fsdp_rank{r}.json").read_text()) for r in (0, 1)]
    single = json.loads((tmp_path / "single.json").read_text())

    plan = {tuple(s) for s in ranks[0]["plan"]}
    for r in [*ranks, single]:
        assert len(r["losses"]) == STEPS
        assert r["train_graphs"] == 0 and r["recompiles"] == 0
        assert r["prewarm_graphs"] >= len(plan)  # every shape compiled before step 1
        assert r["restored"]  # prewarm gave the (sharded) weights and AdamW back untouched
    # the same shape on both ranks at every step, and both row lengths used
    assert ranks[0]["shapes"] == ranks[1]["shapes"]
    assert {tuple(s) for s in ranks[0]["shapes"]} == plan
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the global loss, all-reduced

    # one process, the two ranks' batches concatenated: twice the rows, the same lengths
    assert single["shapes"] == [[2 * rows, length] for rows, length in ranks[0]["shapes"]]
    diffs = [abs(a - b) for a, b in zip(ranks[0]["losses"], single["losses"], strict=True)]
    assert max(diffs) <= 1e-5, (ranks[0]["losses"], single["losses"])
    # the same gradients too (AdamW alone would hide a wrong gradient scale)
    norms = zip(ranks[0]["grad_norms"], single["grad_norms"], strict=True)
    assert all(abs(a - b) <= 1e-5 * b for a, b in norms), (ranks[0], single)
    assert len(set(single["losses"])) > 1  # it trains: a different loss at each step

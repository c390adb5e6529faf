"""The CUDA-graph strategies: refused off CUDA with a reason; on a GPU, recorded at
prewarm for the plan's shapes only, each run reporting the memory the graphs keep."""

from __future__ import annotations

import json

import pytest
import torch

from shapebucket.bench import cli
from shapebucket.bench.strategies import CUDA_ONLY, STRATEGIES
from shapebucket.errors import ShapeBucketError


def resolved(*argv: str):
    args = cli._parser().parse_args(list(argv))
    cli._resolve(args)
    return args


def test_graph_strategies_are_refused_on_cpu_with_the_reason():
    assert set(CUDA_ONLY) == {"shapebucket-graphs", "shapebucket-packed-graphs"}
    assert all(STRATEGIES[n].prewarm for n in CUDA_ONLY)
    with pytest.raises(ShapeBucketError, match="need --device cuda, not cpu"):
        resolved("--quick", "--strategies", "shapebucket-packed-graphs")


def test_all_and_the_profile_leave_them_out_on_cpu():
    assert not set(CUDA_ONLY) & set(resolved("--quick", "--strategies", "all").strategies)
    assert not set(CUDA_ONLY) & set(resolved("--profile", "gpu", "--quick").strategies)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_strategies_record_at_prewarm_and_report_their_memory(tmp_path):
    out = tmp_path / "g.json"
    argv = ["--profile", "gpu", "--quick", "--device", "cuda", "--no-limit", "--plot", ""]
    argv += ["--strategies", "shapebucket-packed,shapebucket-packed-graphs", "--json", str(out)]
    assert cli.main(argv) == 0
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    graphs = results["shapebucket-packed-graphs"]
    assert graphs["error"] is None and graphs["timed_recompiles"] == 0
    assert graphs["graph_memory_mb"] is not None and graphs["graph_memory_mb"] >= 0
    assert results["shapebucket-packed"]["graph_memory_mb"] is None

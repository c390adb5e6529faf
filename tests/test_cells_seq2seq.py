"""docs/examples/seq2seq.py: a tiny T5 trained on two-length buckets under no_recompiles."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "seq2seq.py"


@pytest.mark.slow  # traces a T5 once per cell, twice (prewarm and its verify): 15-40 s
def test_t5_compiles_one_graph_per_cell_used_and_nothing_while_training(fresh_compiler):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("seq2seq_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.build(steps=6, backend="eager", cells_k=2)
    cells = {tuple(c) for c in result["cells"]}
    assert 1 <= len(cells) <= 2
    # rows are padded to the sampler's rows: one shape per cell used, one graph per shape
    assert {tuple(s[1:]) for s in result["plan_shapes"]} == cells
    assert result["prewarm_graphs"] == len(result["plan_shapes"]) == len(cells)
    assert result["training_graphs"] == 0 and result["recompiles"] == 0
    assert result["steps"] == 6

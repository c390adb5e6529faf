"""Cost per computed token by batch length, from a saved benchmark run.

    python benchmarks/step_cost.py docs/img/steps_per_sec_mixture_run2.json
    python benchmarks/step_cost.py docs/img/steps_per_sec_mixture_w256.json \\
        --model-dim 256 --samples 50000 --epoch-samples 2000

Rebuilds each strategy's timed batches from the run's settings (pass the flags the
run was made with besides ``--workload``, which is read from the JSON), pairs each
batch's shape with the median of its step times over the rounds, and prints, per
strategy and padded length, the steps, the computed and real tokens, and the
microseconds per computed and per real token. Measures nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from shapebucket.bench import cli, harness
from shapebucket.bench.batching import build_family


def main(argv: list[str]) -> None:
    run = json.loads(Path(argv[0]).read_text())
    args = cli._parser().parse_args(["--workload", run["config"]["workload"], *argv[1:]])
    cli._resolve(args)
    s = harness._setup(args)
    for r in run["results"]:
        if r["error"] is not None:
            continue
        fam = build_family(r["family"], s)
        shapes = [tuple(b["input_ids"].shape) for b in fam.timed]
        median = np.median(np.asarray(r["step_times"]).reshape(-1, len(shapes)), axis=0)
        by: dict[int, list[float]] = {}
        for (rows, length), dt, real in zip(shapes, median, fam.timed_real, strict=True):
            e = by.setdefault(length, [0, 0, 0, 0.0])
            e[0] += 1
            e[1] += rows * length
            e[2] += real
            e[3] += float(dt)
        print(f"{r['name']}: {median.sum():.2f} s a round (median steps)")
        for length in sorted(by):
            steps, computed, real, sec = by[length]
            print(
                f"  L={length:4d} steps={steps:4.0f} computed={computed:8.0f} real={real:8.0f} "
                f"us/computed={1e6 * sec / computed:6.2f} us/real={1e6 * sec / real:6.2f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])

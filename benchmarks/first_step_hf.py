"""Time from process start to the end of the first training step of the Hugging Face
Trainer example (``docs/examples/hf_trainer.py``: a 1-layer Llama of width 32 on the
standard library's docstrings): eager (``--no-compile``), compiled cold (an empty
output directory and an empty inductor cache) and compiled warm (the output directory
of cold run 0, whose ``compile-cache`` prewarm loads, and an empty inductor cache), for
8 buckets and for packing (``fit_packing`` k=3).

    python benchmarks/first_step_hf.py --runs 3 --out /tmp/first_step_hf

Each run is a fresh process running the example with one step; the time is from just
before the process starts to the end of its first step (the Trainer's ``on_step_end``,
optimizer step included), the median of ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "hf_trainer.py"

# runs the example unchanged; prints the wall-clock time at the end of the first step
CHILD = r"""
import runpy, sys, time
from transformers.trainer_callback import CallbackHandler
handler_step_end = CallbackHandler.on_step_end
def on_step_end(self, *args, **kwargs):
    if not getattr(CallbackHandler, "timed", False):
        CallbackHandler.timed = True
        print("FIRST", time.time(), flush=True)
    return handler_step_end(self, *args, **kwargs)
CallbackHandler.on_step_end = on_step_end
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

LAYOUTS = {"packed": ["--packing"], "buckets": ["--k", "8"]}
HOWS = ("eager", "cold", "warm")


def once(how: str, layout: str, out: str, live: str) -> dict:
    args = [str(EXAMPLE), "1", "--out", out, *LAYOUTS[layout]]
    if how == "eager":
        args.append("--no-compile")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": live}
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"{layout} {how} failed:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    first = float(next(x for x in lines if x.startswith("FIRST")).split()[1])
    result = json.loads(next(x for x in reversed(lines) if x.startswith('{"')))
    return {
        "s": first - t0,
        "prewarm_s": result["prewarm_seconds"],
        "shapes": result["prewarm_shapes"],
        "loaded": result["cache_loaded"],
        "graphs_after_prewarm": result["graphs_after_prewarm"],
        "load": os.getloadavg()[0],
    }


def parse_plan(p: argparse.ArgumentParser, text: str, root: Path) -> list[tuple[str, str]]:
    """``layout:how`` items, checked before anything runs (a usage error otherwise)."""
    plan: list[tuple[str, str]] = []
    for item in text.split(","):
        if item.count(":") != 1:
            p.error(f"argument --plan: {item!r} is not layout:how (e.g. packed:cold)")
        layout, how = item.split(":")
        if layout not in LAYOUTS:
            p.error(f"argument --plan: layout {layout!r} in {item!r}: one of {', '.join(LAYOUTS)}")
        if how not in HOWS:
            p.error(f"argument --plan: how {how!r} in {item!r}: one of {', '.join(HOWS)}")
        cold = (layout, "cold") in plan or (root / f"out-{layout}-cold-0").is_dir()
        if how == "warm" and not cold:
            p.error(f"argument --plan: {item} needs {layout}:cold before it (its cache)")
        plan.append((layout, how))
    return plan


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3, help="fresh processes per item (default 3)")
    p.add_argument(
        "--out", default="/tmp/first_step_hf", help="work directory and first_step_hf.json"
    )
    p.add_argument(
        "--plan",
        default="packed:eager,packed:cold,packed:warm,buckets:eager,buckets:cold,buckets:warm",
        help="layout:how items; warm runs load the cache cold run 0 saved",
    )
    a = p.parse_args()
    if a.runs < 1:
        p.error(f"argument --runs: must be >= 1, got {a.runs}")
    plan = parse_plan(p, a.plan, Path(a.out))
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    results = {}
    for layout, how in plan:
        runs = []
        for i in range(a.runs):
            out = str(root / f"out-{layout}-{how}-{i}")
            if how == "warm":
                out = str(root / f"out-{layout}-cold-0")
            live = tempfile.mkdtemp(prefix="inductor-", dir=root)  # always empty
            runs.append(once(how, layout, out, live))
            print(layout, how, i, runs[-1], flush=True)
        key = f"{layout}/{how}"
        results[key] = {"median_s": statistics.median(r["s"] for r in runs), "runs": runs}
        print(layout, how, "median", round(results[key]["median_s"], 2), flush=True)
    (root / "first_step_hf.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

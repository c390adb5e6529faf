#!/usr/bin/env bash
# The main job: creates .venv, installs shapebucket with the bench extras and runs
# the steps/sec benchmark on CPU (about 8 minutes on 2 cores). Writes
# results/steps_per_sec.json and results/steps_per_sec.png. Extra arguments go
# to the benchmark, e.g. --quick or --workload text.
EXTRAS="bench"
source "$(dirname "$0")/_venv.sh"
.venv/bin/python -m shapebucket bench "$@"

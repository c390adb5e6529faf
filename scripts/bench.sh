#!/usr/bin/env bash
# The main job: creates .venv, installs shapebucket with the bench extras and runs
# the steps/sec benchmark on CPU (11-13 minutes on 2 cores): shapebucket against
# length-grouped peers, in interleaved rounds. Writes
# results/steps_per_sec_mixture.json and .png (--quick: ..._mixture_quick.*).
# Extra arguments go to the benchmark, e.g. --quick or --workload text.
EXTRAS="bench"
source "$(dirname "$0")/_venv.sh"
.venv/bin/python -m shapebucket bench "$@"

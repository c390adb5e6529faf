#!/usr/bin/env bash
# The main job: creates .venv, installs shapebucket with the bench extras and runs
# the steps/sec benchmark on CPU: shapebucket's packing against length-grouped
# and fixed-length packing peers, in interleaved rounds of whole epochs, and the
# limit reference row (about 9 minutes on a 2-core machine, 4.5 with --no-limit;
# --quick about 1 minute). Writes results/steps_per_sec_mixture.json and .png
# (--quick: ..._mixture_quick.*).
# Extra arguments go to the benchmark, e.g. --quick or --workload text.
EXTRAS="bench"
source "$(dirname "$0")/_venv.sh"
.venv/bin/python -m shapebucket bench "$@"

#!/usr/bin/env bash
# The main job: creates .venv, installs shapebucket with the bench extras, runs
# the steps/sec benchmark on CPU. Extra arguments go to the benchmark.
EXTRAS="bench"
source "$(dirname "$0")/_venv.sh"
.venv/bin/python -m shapebucket demo "$@"  # until the steps/sec benchmark lands

#!/usr/bin/env bash
# The whole test suite: creates .venv, installs shapebucket with its test and hf
# extras (trl too; torch pinned to the CPU build by constraints.txt), lints (ruff),
# type-checks (mypy), then runs pytest: unit and property tests, doctests,
# the API-docs check, the benchmark smoke run and every example. The 10 slowest
# tests are printed at the end (--durations), so a run's log says where its time went.
# pytest-xdist runs the files on $SHAPEBUCKET_TEST_WORKERS processes (default 2, this
# project's machine: most tests wait on gcc, a subprocess or Python, not both cores);
# --dist loadfile keeps each file's tests and module fixtures in one process.
EXTRAS="test,hf,trl"
source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff check .
.venv/bin/mypy shapebucket
.venv/bin/python -m pytest -n "${SHAPEBUCKET_TEST_WORKERS:-2}" --dist loadfile --durations=10 "$@"

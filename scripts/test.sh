#!/usr/bin/env bash
# The whole test suite: creates .venv, installs shapebucket with its test extras
# (torch pinned to the CPU build by constraints.txt), lints, then runs pytest.
EXTRAS="test"
source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"

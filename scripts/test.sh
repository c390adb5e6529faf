#!/usr/bin/env bash
# The whole test suite: creates .venv, installs shapebucket with its test and hf
# extras (torch pinned to the CPU build by constraints.txt), lints, checks that
# docs/api.md matches the docstrings, then runs pytest (examples included).
EXTRAS="test,hf"
source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"

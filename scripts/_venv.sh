# Sourced by scripts/test.sh and scripts/bench.sh: make .venv and install the
# package with the extras named in $EXTRAS, pinned by constraints.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check \
  -c constraints.txt -e ".[${EXTRAS}]"

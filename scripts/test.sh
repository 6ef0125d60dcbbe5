#!/usr/bin/env bash
# Run the test suite (sets the environment up first when needed). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check omni_mp tests scripts benchmarks
t0=$(date +%s)
set +e
.venv/bin/python -m pytest -ra --durations=15 --timeout=900 "$@"
rc=$?
set -e
echo "[test] pytest exited $rc after $(( $(date +%s) - t0 ))s"
exit $rc

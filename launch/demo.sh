#!/usr/bin/env bash
# Run the demo pipeline on the embedded default config (tiny CPU models), after set-up when needed.
# Extra args go to `python -m omni_mp.launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m omni_mp.single_engine_demo "$@"

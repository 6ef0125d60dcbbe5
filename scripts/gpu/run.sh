#!/usr/bin/env bash
# The one command on a lent GPU host, in the repository's root, with the last wheel chunk carried:
#   bash scripts/gpu/run.sh BENCHMARK [ARGS...]   ->  python3 -m benchmarks.BENCHMARK ARGS...
#   bash scripts/gpu/run.sh tests [PYTEST ARGS...] ->  python3 -m pytest -m gpu ARGS (default: tests/gpu)
# It installs the carried wheels first (scripts/gpu/install.sh; a no-op once installed) and
# refuses to start while parts are missing. Results: whatever the benchmark writes (--out);
# $OUT, where the device tool sets it, receives a copy of /tmp/omni_mp_results.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 1 ]] || { echo "usage: bash scripts/gpu/run.sh BENCHMARK|tests [ARGS...]" >&2; exit 2; }
bash scripts/gpu/install.sh
source scripts/gpu/env.sh
python3 -c "import torch, vllm; print('[gpu]', torch.cuda.get_device_name(0), 'x', torch.cuda.device_count(), '| vllm', vllm.__version__)"
what=$1; shift
set +e
if [[ $what == tests ]]; then
  python3 -m pytest -m gpu -ra "${@:-tests/gpu}"
else
  python3 -m "benchmarks.$what" "$@"
fi
rc=$?
set -e
if [[ -n ${OUT:-} && -d /tmp/omni_mp_results ]]; then cp -r /tmp/omni_mp_results/. "$OUT/" || true; fi
exit $rc

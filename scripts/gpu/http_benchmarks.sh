#!/usr/bin/env bash
# One GPU call for the HTTP and realtime benchmarks on the shipped Qwen3-Omni config at released sizes (random
# weights): the pipeline starts once (about 3 minutes with its CUDA graphs) and serves them all.
#   bash scripts/gpu/http_benchmarks.sh [TOKENS] [FRAMES] [HTTP_WORKERS] [BENCHMARKS]   (after the wheels are carried: README.md)
# BENCHMARKS: any of serving, serving_spread (HTTP clients from 4 processes), turns, realtime
# (default "serving turns realtime").
# Results: /tmp/omni_mp_results/http_*.json and .log (copied to $OUT where the device tool sets it).
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=${1:-48}; frames=${2:-64}; workers=${3:-1}; benches=" ${4:-serving turns realtime} "
bash scripts/gpu/install.sh
source scripts/gpu/env.sh
res=/tmp/omni_mp_results; mkdir -p "$res"
work=/tmp/qwen3_omni_gpu
config=$(python3 -m benchmarks.common.served "$work" "$tokens" "$frames" "$workers" | tail -1)
port=$(python3 -c "from benchmarks.common.served import free_port; print(free_port())")
log=$res/http_launcher.log
python3 -m omni_mp.launch --config "$config" --http "127.0.0.1:$port" >"$log" 2>&1 &
launcher=$!
trap 'kill -INT $launcher 2>/dev/null; wait $launcher || true; [[ -n ${OUT:-} ]] && cp -r $res/. "$OUT/" || true' EXIT
for _ in $(seq 600); do
  endpoint=$(grep -oP 'serving pipeline .* on \K\S+' "$log" || true)
  [[ -n $endpoint ]] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 $launcher 2>/dev/null || { tail -40 "$log"; exit 1; }
  sleep 1
done
[[ -n ${endpoint:-} ]] || { tail -40 "$log"; exit 1; }
url=http://127.0.0.1:$port
run() { "$@" 2>&1 | grep -v "INFO\|WARNING"; }
if [[ $benches == *" serving "* ]]; then
  run python3 -m benchmarks.http_serving --config "$config" --serving "$url" "$endpoint" --tokens "$tokens" \
    --out $res/http_serving_qwen3.json | tee $res/http_serving_qwen3.log
fi
if [[ $benches == *" serving_spread "* ]]; then
  run python3 -m benchmarks.http_serving --config "$config" --serving "$url" "$endpoint" --tokens "$tokens" \
    --http-clients 4 --out $res/http_serving_spread_qwen3.json | tee $res/http_serving_spread_qwen3.log
fi
if [[ $benches == *" turns "* ]]; then
  run python3 -m benchmarks.http_turns --config "$config" --serving "$url" --tokens "$tokens" \
    --out $res/http_turns_qwen3.json | tee $res/http_turns_qwen3.log
fi
if [[ $benches == *" realtime "* ]]; then
  run python3 -m benchmarks.realtime_sessions --config "$config" --url "$url" --tokens "$tokens" \
    --out $res/realtime_sessions_qwen3.json | tee $res/realtime_sessions_qwen3.log
fi

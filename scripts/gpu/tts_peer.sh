#!/usr/bin/env bash
# One GPU call: vllm-omni 0.25.0rc1 serving Qwen3-TTS beside omni_mp's run (issue 50 item 4), after
# our wheels (.gpu/omni*) and the peer's (.gpu/peer*) are installed (README.md; this call may carry
# the last chunk of either: install.sh runs first):
#   1. the released-size random-weight checkpoint of scripts/gpu/tts_benchmark.sh (reused from an
#      earlier call on the same warm machine; its missing files added);
#   2. vllm-omni's server on it (benchmarks.peer_tts_serve: its shipped deploy/qwen3_tts.yaml with
#      benchmarks/peer/qwen3_tts_1gpu.yaml over it; /tmp/peer-site on the server's path only);
#   3. benchmarks/tts_serving.py --serving at 5, 10, 20, 40 requests/s, the same client, sentences,
#      lengths and defaults as omni_mp's run; then both side by side when omni_mp's result is there.
#   bash scripts/gpu/tts_peer.sh [DURATION_S]   (default 15 s a rate; whole call < 540 s)
# Every phase runs under `timeout` against one deadline. Results (few files: the device tool
# returns 8): /tmp/omni_mp_results/tts_peer_{build,server,serving}.log, tts_peer.json,
# tts_peer_compare.md, copied to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-15}
t0=$(date +%s)
deadline=$((t0 + ${2:-530}))  # the whole call's seconds (second argument)
left() { echo $((deadline - $(date +%s))); }
phase() { echo "[tts_peer $(date +%T) +$(($(date +%s) - t0))s] $*"; }
res=/tmp/omni_mp_results; mkdir -p "$res"
work=/tmp/qwen3_tts_gpu
server=""
finish() {
  if [[ -n $server ]]; then  # its own process group (setsid): the server and its stage processes
    kill -INT -- "-$server" 2>/dev/null; timeout 30 tail --pid="$server" -f /dev/null
    kill -9 -- "-$server" 2>/dev/null
  fi
  [[ -n ${OUT:-} ]] && cp "$res"/tts_peer* "$OUT/" 2>/dev/null
  phase "done"
}
trap finish EXIT

phase "install"
bash scripts/gpu/install.sh || { echo "[tts_peer] wheels missing: carry them first (scripts/gpu/README.md)"; exit 3; }
[[ -d /tmp/peer-site/vllm_omni ]] || { echo "[tts_peer] vllm-omni not in /tmp/peer-site: carry .gpu/peer*"; exit 3; }
source scripts/gpu/env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader  # nothing else should hold it

phase "checkpoint ($work)"
timeout 200 python3 -m benchmarks.tts_serving --write-released "$work" >"$res/tts_peer_build.log" 2>&1
echo "exit $?" >>"$res/tts_peer_build.log"
tail -2 "$res/tts_peer_build.log"
model=$(ls -d "$work"/qwen3_tts-1.7b-released 2>/dev/null)
[[ -f $model/config.json ]] || { phase "no checkpoint (see tts_peer_build.log)"; exit 1; }

phase "serve vllm-omni on $model"
port=$(python3 -c "from benchmarks.common.served import free_port; print(free_port())")
setsid python3 -m benchmarks.peer_tts_serve --model "$model" --port "$port" >"$res/tts_peer_server.log" 2>&1 &
server=$!
up=""
wait_healthy "$port" "$server" $((deadline - 150)) 2 && up=1
grep -E "^\[peer_tts_serve\]|Error|error|Traceback" "$res/tts_peer_server.log" | grep -v " INFO " | head -12
[[ -n $up ]] || { phase "server not up"; tail -60 "$res/tts_peer_server.log"; exit 1; }
phase "server up"
curl -s "http://127.0.0.1:$port/v1/models" | head -c 300; echo

budget=$(( $(left) - 10 ))
phase "benchmark (${budget}s left)"
timeout "$budget" python3 -m benchmarks.tts_serving --serving "http://127.0.0.1:$port" --system "vllm-omni 0.25.0rc1" \
  --duration "$duration" --warmup 3 --drain 15 --fixed-length --voice vivian --out "$res/tts_peer.json" \
  2>&1 | tee "$res/tts_peer_serving.log"
phase "benchmark exit ${PIPESTATUS[0]}"
if [[ -f $res/tts_serving.json && -f $res/tts_peer.json ]]; then
  python3 -m benchmarks.tts_serving --compare "$res/tts_serving.json" "$res/tts_peer.json" | tee "$res/tts_peer_compare.md"
fi

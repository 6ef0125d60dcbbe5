#!/usr/bin/env bash
# One GPU call for Qwen3-TTS (issue 50 item 4), after the wheels are carried (README.md):
#   1. the GPU checks tests/gpu/test_qwen3_tts_graphs.py (tiny pipeline: CUDA graphs vs eager),
#      test_sampler_warmup.py (no kernel compiled while sampled batches are served) and
#      test_snake_kernel.py (the decoder's SnakeBeta kernel vs transformers, and its speed),
#      while the released-size random-weight checkpoint is built beside it (CPU + a little GPU);
#   2. the shipped stage_configs/qwen3_tts.yaml served on it (a copy: model path, EOS suppressed);
#   3. benchmarks/tts_serving.py --serving at 5, 10, 20, 40 requests/s, the stages' step
#      timelines recorded (OMNI_MP_PROFILE_DIR) and summarized per rate once the server stopped.
#   bash scripts/gpu/tts_benchmark.sh [DURATION_S] [nocheck] [RATES]   (default 15 s a rate; whole call
#   < 540 s; nocheck: skip step 1's GPU check, e.g. when it passed in an earlier call on the same code;
#   RATES: requests/s, comma-separated, default 5,10,20,40)
# Every phase runs under `timeout` against one deadline, so a hang leaves the others' results.
# Results (few files: the device tool returns 8): /tmp/omni_mp_results/tts_{check,build,launcher,serving}.log,
# tts_serving.json (with each rate's stage steps), copied to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-15}
check=${2:-check}
rates=${3:-5,10,20,40}
t0=$(date +%s)
deadline=$((t0 + 530))
left() { echo $((deadline - $(date +%s))); }
phase() { echo "[tts $(date +%T) +$(($(date +%s) - t0))s] $*"; }
res=/tmp/omni_mp_results; mkdir -p "$res"
work=/tmp/qwen3_tts_gpu
launcher=""
finish() {
  [[ -n $launcher ]] && { kill -INT "$launcher" 2>/dev/null; timeout 30 tail --pid="$launcher" -f /dev/null; kill -9 "$launcher" 2>/dev/null; }
  [[ -n ${OUT:-} ]] && cp "$res"/tts_* "$res"/*.json "$OUT/" 2>/dev/null
  phase "done"
}
trap finish EXIT

phase "install"
bash scripts/gpu/install.sh || { echo "[tts] wheels missing: carry them first (scripts/gpu/README.md)"; exit 3; }
source scripts/gpu/env.sh
export OMNI_MP_GPU_REPORTS=$res  # the GPU check's report (tests/gpu/conftest.py), copied to $OUT
python3 -c "import torch, vllm; print('[gpu]', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| vllm', vllm.__version__)"

phase "build the released checkpoint (background) + GPU check"
( timeout 200 python3 -m benchmarks.tts_serving --write-released "$work" >"$res/tts_build.log" 2>&1;
  echo "exit $?" >>"$res/tts_build.log" ) &
builder=$!
if [[ $check != nocheck ]]; then
  timeout $(( $(left) < 260 ? $(left) : 260 )) python3 -m pytest -m gpu -ra -q tests/gpu/test_qwen3_tts_graphs.py \
    tests/gpu/test_sampler_warmup.py tests/gpu/test_snake_kernel.py \
    -p no:cacheprovider 2>&1 | tee "$res/tts_check.log" | grep -v "INFO\|WARNING" | tail -40
  phase "GPU check exit ${PIPESTATUS[0]}"
fi
wait "$builder"
tail -3 "$res/tts_build.log"
config=$(grep -E '\.yaml$' "$res/tts_build.log" | tail -1)
[[ -f $config ]] || { phase "no released config (see tts_build.log)"; exit 1; }

phase "serve $config"
prof=/tmp/omni_mp_timelines; rm -rf "$prof"; mkdir -p "$prof"
export OMNI_MP_PROFILE_DIR=$prof  # the stages write their step timelines there when they stop
port=$(python3 -c "from benchmarks.common.served import free_port; print(free_port())")
python3 -m omni_mp.launch --config "$config" --http "127.0.0.1:$port" >"$res/tts_launcher.log" 2>&1 &
launcher=$!
up=""
wait_healthy "$port" "$launcher" $((deadline - 100)) 1 && up=1
grep -E "ready in|error|Error" "$res/tts_launcher.log" | grep -v "INFO" | tail -8
[[ -n $up ]] || { phase "server not up"; tail -40 "$res/tts_launcher.log"; exit 1; }
phase "server up"

budget=$(( $(left) - 10 ))
phase "benchmark (${budget}s left)"
timeout "$budget" python3 -m benchmarks.tts_serving --serving "http://127.0.0.1:$port" --config "$config" \
  --rates "$rates" --duration "$duration" --warmup 3 --drain 15 --fixed-length --voice vivian --out "$res/tts_serving.json" \
  2>&1 | tee "$res/tts_serving.log"
phase "benchmark exit ${PIPESTATUS[0]}"
kill -INT "$launcher" 2>/dev/null; timeout 40 tail --pid="$launcher" -f /dev/null; launcher=""
python3 -m benchmarks.tts_serving --timelines "$prof" --out "$res/tts_serving.json" 2>&1 | tee -a "$res/tts_serving.log"

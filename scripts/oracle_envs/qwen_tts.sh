#!/usr/bin/env bash
# Build the Qwen3-TTS oracle environment: qwen-tts 0.1.1 with its own pins (transformers 4.57.3,
# accelerate 1.12.0), which cannot share .venv (transformers 5.17.0). The oracle tests run it as a
# subprocess (tests/qwen3_tts_oracle.py) and skip when it is absent.
# Usage: scripts/oracle_envs/qwen_tts.sh [VENV_DIR]   (default: $QWEN_TTS_VENV or .venv-qwen-tts)
# torch: the CPU wheel 2.13.0 (the machine's wheel folder has it; PyPI's torch pulls GBs of CUDA
# wheels). qwen-tts imports torchaudio only for kaldi fbank in its 25 Hz tokenizer (pure Python):
# the newest torchaudio on PyPI (2.11.1) goes in without deps, as no 2.13 build exists there.
# PyPI's torchaudio is a CUDA build: its compiled ops (lib/*.so) need libc10_cuda, which a CPU
# torch lacks, and `import torchaudio` fails. Without them torchaudio imports as its pure-Python
# part (its own loader treats absent libraries as "not built"), which is all qwen-tts uses.
set -euo pipefail
VENV="${1:-${QWEN_TTS_VENV:-.venv-qwen-tts}}"
PY="${PYTHON:-python3}"
start=$(date +%s)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import qwen_tts" 2>/dev/null; then
  echo "[qwen-tts env] $VENV already has qwen_tts"; exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q --no-deps "torchaudio==2.11.1"
"$VENV/bin/pip" install -q "qwen-tts==0.1.1" "torch==2.13.0"
rm -f "$VENV"/lib/python3*/site-packages/torchaudio/lib/*.so
"$VENV/bin/python" -c "import qwen_tts, torch, transformers; print('[qwen-tts env] torch', torch.__version__, '| transformers', transformers.__version__)"
echo "[qwen-tts env] built in $(( $(date +%s) - start )) s"

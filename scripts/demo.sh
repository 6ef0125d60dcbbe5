#!/usr/bin/env bash
# Run the demo on the embedded default config (omni_mp/stage_configs/tiny_qwen2_5_omni.yaml: Qwen2.5-Omni's
# thinker -> talker -> token2wav on a tiny random checkpoint, CPU), after set-up when needed.
# Text in; text, a one-line summary per request and a .wav per request out (outputs/demo).
# Extra args go to `python -m omni_mp.launch` (e.g. --config, --prompt, --audio FILE,
# --image FILE, --speaker Ethan, --output-dir); without --prompt, two demo prompts run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
args=("$@")
if [[ ! " ${args[*]-} " =~ " --prompt" ]]; then
  args+=(--prompt "Hello world, how are you?" --prompt "Tell me a story about a robot who learned to sing.")
fi
if [[ ! " ${args[*]-} " =~ " --output-dir" ]]; then
  args+=(--output-dir outputs/demo)
fi
exec .venv/bin/python -m omni_mp.launch "${args[@]}"

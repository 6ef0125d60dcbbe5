"""How the memory planner (omni_mp.control.memory_budget) sizes a stage on a Qwen3-TTS checkpoint
(config.json `model_type: qwen3_tts`):

- the talker stage (`model_part: qwen3_tts_talker`) runs `talker.*` of model.safetensors, its
  code predictor included, less the text embedding and projection: the entry stage's prompt
  format builds the prompt rows from them on the CPU (prompt.TtsPromptBuilder) and our vLLM
  talker does not load them (vllm_hooks_talker); its KV cache and activations are
  `talker_config`'s;
- the decoder stage (`kind: diffusion`) runs `decoder.*` of speech_tokenizer/model.safetensors,
  fp32; its convolutions are Qwen3-Omni code2wav's at `latent_dim` (codec_decoder), so their
  activations and CUDA graphs are Qwen3-Omni's estimate at those sizes.

There is no transformers class for this model: a stage with a budget needs the weight files
(`load_format: dummy` cannot be sized from the config alone; the planner says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_mp.utils.gpu_memory import MemoryBudgetError

if TYPE_CHECKING:
    from omni_mp.config.schema import StageConfig

SPEECH_TOKENIZER = "speech_tokenizer"  # the decoder's dir inside the checkpoint
# Inside `talker.`: what the entry stage holds on the CPU, not the talker stage on its GPU.
ENTRY_STAGE_WEIGHTS = {"model.text_embedding.", "text_projection."}


class Qwen3TtsSizing:
    def part(self, stage: StageConfig) -> str:
        return "decoder" if stage.kind == "diffusion" else "talker"

    def skipped(self, stage: StageConfig, part: str) -> set[str]:
        return set(ENTRY_STAGE_WEIGHTS) if part == "talker" else set()

    def part_dir(self, model_dir: Path, part: str) -> Path:
        return model_dir / SPEECH_TOKENIZER if part == "decoder" else model_dir

    def meta_model(self, config: Any, part: str) -> tuple[type, Any]:
        raise MemoryBudgetError(f"Qwen3-TTS's {part} has no transformers class: it is sized from its safetensors")

    def text_config(self, config: dict[str, Any], part: str) -> dict[str, Any]:
        return config["talker_config"]

    def diffusion_activations(self, stage: StageConfig, config: dict[str, Any]) -> int:
        """Qwen3-Omni code2wav's estimate at the decoder's convolution sizes (`config`:
        speech_tokenizer/config.json), its windows at least the reference's chunk context
        (codec_decoder.LEFT_CONTEXT_FRAMES: a chunk's context runs as a window of its own),
        plus the code embedding of transformers' code2wav module, which the decoder builds
        on its device but never reads (its own front replaces it)."""
        from omni_mp.models.qwen3_omni.sizing import code2wav_activations
        from omni_mp.models.qwen3_tts.codec_decoder import LEFT_CONTEXT_FRAMES, omni_code2wav_config

        d = config["decoder_config"]
        c2w = omni_code2wav_config(d, d["latent_dim"]).to_dict()
        c2w["head_dim"] = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
        unused_embedding = d["codebook_size"] * d["num_quantizers"] * d["latent_dim"] * 4
        return code2wav_activations(stage, c2w, LEFT_CONTEXT_FRAMES) + unused_embedding


SIZING = Qwen3TtsSizing()

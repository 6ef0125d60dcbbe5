"""How the memory planner (omni_mp.control.memory_budget) sizes a stage on a Qwen2.5-Omni
checkpoint: which part a stage runs, which towers vLLM leaves out, the part's Hugging Face
class (for a parameter count without weights), its text config, and token2wav's activations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_mp.models.family import unbuilt_omni_towers

if TYPE_CHECKING:
    from omni_mp.config.schema import StageConfig


class Qwen25OmniSizing:
    def part(self, stage: StageConfig) -> str:
        """'token2wav' (a diffusion stage), 'talker' (`model_part: talker`), else 'thinker':
        vLLM's registered omni class runs the thinker."""
        if stage.kind == "diffusion":
            return "token2wav"
        return str(stage.model_part or "thinker")

    def skipped(self, stage: StageConfig, part: str) -> set[str]:
        """Thinker towers vLLM does not build: those whose modalities all have limit 0."""
        return unbuilt_omni_towers(stage) if part == "thinker" else set()

    def part_dir(self, model_dir: Path, part: str) -> Path:
        return model_dir  # every part in the checkpoint's own files

    def meta_model(self, config: Any, part: str) -> tuple[type, Any]:
        from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as m

        return {
            "thinker": (m.Qwen2_5OmniThinkerForConditionalGeneration, config.thinker_config),
            "talker": (m.Qwen2_5OmniTalkerForConditionalGeneration, config.talker_config),
            "token2wav": (m.Qwen2_5OmniToken2WavModel, config.token2wav_config),
        }[part]

    def text_config(self, config: dict[str, Any], part: str) -> dict[str, Any]:
        return config["thinker_config"]["text_config"] if part == "thinker" else config["talker_config"]

    def diffusion_activations(self, stage: StageConfig, config: dict[str, Any]) -> int:
        """`max_batch` trajectories of token2wav at once, fp32: per mel frame, the DiT's widest
        buffers (x2 for classifier-free guidance) and BigVGAN's widest stage with its temporaries."""
        t2w = config.get("token2wav_config", {})
        dit, voc = t2w.get("dit_config", {}), t2w.get("bigvgan_config", {})
        d = stage.diffusion
        repeats = dit.get("repeats", 2)
        s = d.streaming
        window = s.largest_chunk() + s.left_context + s.right_context
        frames = repeats * (window if d.stream else d.max_input_len)
        hidden = dit.get("hidden_size", 1024)
        dit_bytes = 2 * frames * hidden * (4 + 2 * dit.get("ff_mult", 2)) * 4
        channels, length, widest = voc.get("upsample_initial_channel", 1536), 1, 0
        for rate in voc.get("upsample_rates", [5, 3, 2, 2, 2, 2]):
            channels, length = channels // 2, length * rate
            widest = max(widest, channels * length)
        voc_bytes = frames * widest * 4 * 8  # snake activations and residual sums keep ~8 live copies
        return d.max_batch * (dit_bytes + voc_bytes)


SIZING = Qwen25OmniSizing()

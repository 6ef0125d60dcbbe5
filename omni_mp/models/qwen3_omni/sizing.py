"""How the memory planner (omni_mp.control.memory_budget) sizes a stage on a Qwen3-Omni
checkpoint (config.json `model_type: qwen3_omni_moe`): the part a stage runs (`thinker.*`,
`talker.*` with its code predictor, `code2wav.*`), the thinker towers vLLM leaves out, each
part's Hugging Face class (a parameter count without weights), its decoder's config, and
code2wav's activations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_mp.models.family import unbuilt_omni_towers

if TYPE_CHECKING:
    from omni_mp.config.schema import StageConfig

# model_part -> the checkpoint part it runs (a stage with no model_part runs the thinker).
PARTS = {"qwen3_omni_thinker": "thinker", "qwen3_omni_talker": "talker"}


class Qwen3OmniSizing:
    def part(self, stage: StageConfig) -> str:
        if stage.kind == "diffusion":
            return "code2wav"
        return PARTS.get(stage.model_part or "", "thinker")

    def skipped(self, stage: StageConfig, part: str) -> set[str]:
        """Thinker towers vLLM does not build: those whose modalities all have limit 0."""
        return unbuilt_omni_towers(stage) if part == "thinker" else set()

    def part_dir(self, model_dir: Path, part: str) -> Path:
        return model_dir  # every part in the checkpoint's own files

    def meta_model(self, config: Any, part: str) -> tuple[type, Any]:
        from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

        return {
            "thinker": (m.Qwen3OmniMoeThinkerForConditionalGeneration, config.thinker_config),
            "talker": (m.Qwen3OmniMoeTalkerForConditionalGeneration, config.talker_config),
            "code2wav": (m.Qwen3OmniMoeCode2Wav, config.code2wav_config),
        }[part]

    def text_config(self, config: dict[str, Any], part: str) -> dict[str, Any]:
        return config["thinker_config" if part == "thinker" else "talker_config"]["text_config"]

    def diffusion_activations(self, stage: StageConfig, config: dict[str, Any]) -> int:
        return code2wav_activations(stage, config.get("code2wav_config", {}))


def code2wav_activations(stage: StageConfig, c2w: dict[str, Any], min_window_frames: int = 0) -> int:
    """`max_batch` windows decoded at once, fp32: per frame (16 codes) of a window, the decoder's widest
    stage (channels halve as each upsampling stage multiplies the length) with its
    temporaries (SnakeBeta and residual sums keep ~8 live copies). `c2w`: a code2wav config
    (dict); `min_window_frames`: a window the decoder may run beside the streamed chunks (e.g.
    Qwen3-TTS's chunk contexts), when longer than them."""
    groups = int(c2w.get("num_quantizers", 16))
    d = stage.diffusion
    s = d.streaming
    codes = s.largest_chunk() + s.left_context + s.right_context if d.stream else d.max_input_len
    # + 1: the inputs each convolution kept from the chunk before (code2wav_convs), under a
    # frame's worth at every layer.
    frames = max(-(-codes // groups), min_window_frames) + 1
    channels, length, widest = int(c2w.get("decoder_dim", 1536)), 1, 0
    for rate in c2w.get("upsampling_ratios", [2, 2]):
        length *= rate
        widest = max(widest, int(c2w.get("hidden_size", 1024)) * length)
    for rate in c2w.get("upsample_rates", [8, 5, 4, 3]):
        channels, length = channels // 2, length * rate
        widest = max(widest, channels * length)
    eager = d.max_batch * frames * widest * 4 * 8
    return eager + (_graph_bytes(stage, c2w) if d.cuda_graphs and d.stream else 0)


def _graph_bytes(stage: StageConfig, c2w: dict[str, Any]) -> int:
    """What code2wav's CUDA graphs keep (code2wav.py, `use_graphs`): each graph its own static
    inputs and outputs, fp32. Per row bucket up to `max_batch`'s, the transformer's cached
    keys and values (`sliding_window - 1` frames) and new ones; per row bucket and streamed
    convolution shape, the kept inputs in and out and the samples. Their temporaries share one
    pool, as large as the largest call's (the eager activations above). 2.2 GB for
    omni_mp/stage_configs/qwen3_omni.yaml (64 windows a step, ten row buckets)."""
    import torch
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omni_mp.engines.diffusion.graphs import buckets_upto
    from omni_mp.models.qwen3_omni.code2wav import streamed_shapes
    from omni_mp.models.qwen3_omni.code2wav_convs import StreamingConvs

    d = stage.diffusion
    config = Qwen3OmniMoeCode2WavConfig.from_dict(c2w)
    with torch.device("meta"):
        convs_plan = StreamingConvs(Qwen3OmniMoeCode2Wav._from_config(config))
    state, samples = convs_plan.state_size, convs_plan.samples_per_frame
    groups = int(config.num_quantizers)
    rows = sum(buckets_upto(d.max_batch, d.graph_batch_sizes))
    frames, shapes = streamed_shapes(d.streaming, groups)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_frame = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim
    transformer = kv_frame * (config.sliding_window - 1 + frames) + frames * config.hidden_size
    convs = sum(n * (config.hidden_size + samples) + state * (1 if first else 2) for n, first in shapes)
    return rows * (transformer + convs) * 4


SIZING = Qwen3OmniSizing()

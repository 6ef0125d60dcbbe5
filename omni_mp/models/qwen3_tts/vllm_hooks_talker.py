"""The Qwen3-TTS talker with its code predictor as a vLLM 0.25.0 model, registered by our code.

Qwen3-Omni's talker model (omni_mp.models.qwen3_omni.vllm_hooks_talker: the code predictor of
frame t at the start of the next forward, the per-request hidden-state slots, the `[hidden + 16]`
output rows) with what the reference (qwen-tts 0.1.1) differs in (docs/qwen3_tts.md):
- the decoder is vLLM's dense `Qwen3Model` (q/k norms, gated SiLU MLP) instead of the MoE one;
  its M-RoPE over text-only positions is plain RoPE, so vLLM's arange positions are the reference's;
- the talker's text embedding and text projection are the entry stage's (prompt and step rows,
  omni_mp.models.qwen3_tts.prompt), not the engine's; a Base checkpoint's speaker encoder too.
Not yet: a code predictor narrower than the talker (`small_to_mtp_projection`: refused at load),
and the reference's sampled code predictor settings (top-p 1.0, temperature 0.9; Qwen3-Omni's are
used when sampling), so only greedy requests equal the reference.
"""

from __future__ import annotations

from typing import Any

from vllm.model_executor.models.qwen3 import Qwen3Model
from vllm.model_executor.models.utils import WeightsMapper

from omni_mp.models.family import EngineModel
from omni_mp.models.qwen3_omni.vllm_hooks_talker import OmniMpQwen3OmniTalker
from omni_mp.models.qwen3_tts.talker_view import TALKER_ARCH, talker_view_dir


class OmniMpQwen3TtsTalker(OmniMpQwen3OmniTalker):
    """vLLM's view of qwen-tts's `Qwen3TTSTalkerForConditionalGeneration` (module names follow it)."""

    decoder_cls = Qwen3Model
    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={
            "talker.model.codec_embedding.": "model.embed_tokens.",
            "talker.model.text_embedding.": None,  # the entry stage's (prompt rows)
            "talker.code_predictor.": "code_predictor.",
            "talker.codec_head.": "codec_head.",
            "talker.model.": "model.",
            "talker.text_projection.": None,
            "speaker_encoder.": None,
        }
    )


def register_talker() -> None:
    """Make `TALKER_ARCH` resolvable by vLLM (idempotent; before vLLM builds the engine config)."""
    from vllm import ModelRegistry

    if TALKER_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(TALKER_ARCH, OmniMpQwen3TtsTalker)


def talker_engine_model(model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
    """`model_part: qwen3_tts_talker`: our vLLM model of the talker, loaded from a view of the
    checkpoint whose config is the talker's; codec ids are not text, so vLLM starts no tokenizer."""
    register_talker()
    view = talker_view_dir(model_dir, require_weights=engine_args.get("load_format") != "dummy")
    return EngineModel(str(view), {**engine_args, "skip_tokenizer_init": True})

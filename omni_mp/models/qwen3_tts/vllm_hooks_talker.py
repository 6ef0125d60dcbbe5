"""The Qwen3-TTS talker with its code predictor as a vLLM 0.25.0 model, registered by our code.

Qwen3-Omni's talker model (omni_mp.models.qwen3_omni.vllm_hooks_talker: the code predictor of
frame t at the start of the next forward, the per-request hidden-state slots, the `[hidden + 16]`
output rows) with what the reference (qwen-tts 0.1.1) differs in (docs/qwen3_tts.md):
- the decoder is vLLM's dense `Qwen3Model` (q/k norms, gated SiLU MLP) instead of the MoE one;
  its M-RoPE over text-only positions is plain RoPE, so vLLM's arange positions are the reference's;
- the code predictor may be narrower than the talker (the released 1.7B: 1024 under 2048):
  `small_to_mtp_projection` (Linear talker -> predictor width, with bias; loaded by vLLM's loader
  as `talker.code_predictor.small_to_mtp_projection.*`) maps each of its inputs (the talker's
  hidden state, the code embeddings, which stay at the talker's width and are summed unprojected
  into the talker's next input); identity when the widths agree (0.6B). A module of the forward,
  so CUDA graphs capture it like the rest;
- a sampled request's code predictor draws with the reference's `subtalker_*` settings (the
  checkpoint's generation_config.json over generate()'s defaults: top-k 50, top-p 1.0,
  temperature 0.9; `subtalker_dosample: false` keeps it greedy), carried by the talker view's
  config (talker_view.subtalker_sampling). A greedy request (temperature 0) stays greedy
  throughout, as Qwen3-Omni's generate mirrors the talker's do_sample; the reference samples
  the code predictor after a greedy talker unless `subtalker_dosample` is false;
- the talker's text embedding and text projection are the entry stage's (prompt and step rows,
  omni_mp.models.qwen3_tts.prompt), not the engine's; a Base checkpoint's speaker encoder too.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from vllm.model_executor.models.qwen3 import Qwen3Model
from vllm.model_executor.models.utils import WeightsMapper

from omni_mp.models.family import EngineModel
from omni_mp.models.qwen3_omni.vllm_hooks_talker import CodePredictor, CodeSampling, OmniMpQwen3OmniTalker, _get
from omni_mp.models.qwen3_tts.talker_view import TALKER_ARCH, SubtalkerSampling, talker_view_dir


def code_sampling(subtalker: SubtalkerSampling) -> CodeSampling:
    """The reference's code predictor settings as our sampler's (the same warpers, same order)."""
    return CodeSampling(
        do_sample=subtalker.subtalker_dosample,
        top_k=subtalker.subtalker_top_k,
        top_p=subtalker.subtalker_top_p,
        temperature=subtalker.subtalker_temperature,
    )


class TtsCodePredictor(CodePredictor):
    """qwen-tts's `Qwen3TTSTalkerCodePredictorModelForConditionalGeneration`: Qwen3-Omni's code
    predictor with `small_to_mtp_projection` and the checkpoint's sampling settings."""

    def __init__(self, cfg: Any, prefix: str, talker_hidden: int | None = None) -> None:
        super().__init__(cfg, prefix, talker_hidden)
        self.sampling = code_sampling(SubtalkerSampling(**(_get(cfg, "subtalker") or {})))

    def input_projection(self, talker_hidden: int, hidden: int) -> nn.Module:
        if talker_hidden == hidden:
            return nn.Identity()  # as the reference: no weights then
        return nn.Linear(talker_hidden, hidden, bias=True)


class OmniMpQwen3TtsTalker(OmniMpQwen3OmniTalker):
    """vLLM's view of qwen-tts's `Qwen3TTSTalkerForConditionalGeneration` (module names follow it)."""

    decoder_cls = Qwen3Model
    code_predictor_cls = TtsCodePredictor
    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={
            "talker.model.codec_embedding.": "model.embed_tokens.",
            "talker.model.text_embedding.": None,  # the entry stage's (prompt rows)
            "talker.code_predictor.": "code_predictor.",  # small_to_mtp_projection included
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

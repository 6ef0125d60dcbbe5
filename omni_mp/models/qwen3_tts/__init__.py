"""Qwen3-TTS (the `qwen-tts` package's checkpoints: CustomVoice, VoiceDesign, Base): a talker with
its code predictor, then a 12 Hz codec decoder. Facts and what differs from Qwen3-Omni:
docs/qwen3_tts.md.

- `tiny_config` / `tiny`: tiny checkpoints in the reference's on-disk format (tests), one with
  the released 1.7B's shape (a code predictor narrower than the talker).
- `prompt`: the talker's prompt and step rows for a request (preset voice, language,
  instructions), equal to the reference's.
- `speaker`: Base's speaker encoder (x-vector cloning), equal to the reference's.
- `codec_decoder`: the speech tokenizer's decoder as a streaming window decoder
  (`diffusion.model_type: qwen3_tts_codec`), Qwen3-Omni code2wav's streaming with its own front.
- `clip_codes`: a reference clip's codes (the speech tokenizer's Mimi encoder, transformers').
- `clone`: Base cloning on the entry stage (clip rules, x-vector and codes, a small cache).
- `codec_inputs`: the talker -> decoder link (`processor: qwen3_tts_codec`), an in-context
  clip's codes first as the decoder's context.

- `vllm_hooks_talker`: our vLLM model of the talker with its code predictor inside its step
  (`model_part: qwen3_tts_talker`; `small_to_mtp_projection`, the reference's code predictor
  sampling), loaded from a `talker_view` of the checkpoint.

- `sizing`: what the GPU memory planner needs to know of its checkpoints.
- `prompt.PROMPT_FORMAT` (`prompt_format: qwen3_tts`): the entry talker stage's prompt rows from
  a request's text, speaker (preset voice) and params (instructions, language).
Not yet: the text-streaming prompt mode on a served stage (docs/qwen3_tts.md).
This module only declares names (omni_mp.models.registry reads them).
"""

from typing import Any

from omni_mp.models.family import Family, Processor


def _codec_decoder() -> Any:
    from omni_mp.models.qwen3_tts.codec_decoder import TtsCodecDecoder

    return TtsCodecDecoder.from_checkpoint


def _codec_inputs() -> Any:
    from omni_mp.models.qwen3_tts.codec_inputs import Qwen3TtsCodecInputs

    return Qwen3TtsCodecInputs


def _prompt_format() -> Any:
    from omni_mp.models.qwen3_tts.prompt import PROMPT_FORMAT

    return PROMPT_FORMAT


def _talker() -> Any:
    from omni_mp.models.qwen3_tts.vllm_hooks_talker import talker_engine_model

    return talker_engine_model


def _sizing() -> Any:
    from omni_mp.models.qwen3_tts.sizing import SIZING

    return SIZING


def _tiny() -> Any:
    from omni_mp.models.qwen3_tts.tiny import build_named

    return build_named


FAMILY = Family(
    name="qwen3_tts",
    processors={"qwen3_tts_codec": Processor(_codec_inputs, needs_hidden_states=True, feeds_diffusion=True)},
    prompt_formats={"qwen3_tts": _prompt_format},
    model_parts={"qwen3_tts_talker": _talker},
    diffusion_models={"qwen3_tts_codec": _codec_decoder},
    checkpoint_types={"qwen3_tts": _sizing},
    builtin_models={
        "tiny-qwen3-tts-custom-voice": _tiny,
        "tiny-qwen3-tts-voice-design": _tiny,
        "tiny-qwen3-tts-base": _tiny,
        "tiny-qwen3-tts-narrow-predictor": _tiny,  # the 1.7B's shape: predictor narrower than the talker
    },
)

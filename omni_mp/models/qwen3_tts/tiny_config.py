"""Configs of a tiny Qwen3-TTS checkpoint in the reference's format (qwen-tts 0.1.1): the top
config.json (model_type "qwen3_tts", talker + code predictor + speaker encoder) and the speech
tokenizer's (model_type "qwen3_tts_tokenizer_12hz": a Mimi encoder + the 12 Hz decoder).

Every size is written explicitly (the reference's defaults are not a real model's: e.g. its
talker default codec ids 4196.. and 32 code groups). Codec special ids sit in the top 1024 ids
of the talker vocab, as the reference suppresses that range (but eos) while generating.
"""

from __future__ import annotations

from typing import Any

import msgspec

from omni_mp.models.qwen3_tts.talker_view import SubtalkerSampling

NUM_CODE_GROUPS = 16
CODEC_SPECIAL_RANGE = 1024  # talker vocab = codebook + this (generate suppresses it but eos)
# Codec specials as offsets above the codebook (the talker's own codec ids).
CODEC_OFFSETS = {
    "codec_pad_id": 100,
    "codec_bos_id": 101,
    "codec_eos_token_id": 102,
    "codec_think_id": 106,
    "codec_nothink_id": 107,
    "codec_think_bos_id": 108,
    "codec_think_eos_id": 109,
}
LANGUAGE_OFFSETS = {"chinese": 150, "english": 151, "beijing_dialect": 160}
# Preset voices of the tiny CustomVoice checkpoint: offsets above the codebook, and the dialect
# each speaks when the language is Chinese or auto (False: none), as the reference reads them.
SPEAKER_OFFSETS = {"vivian": 200, "ryan": 201, "dylan": 202}
SPEAKER_DIALECTS: dict[str, str | bool] = {"vivian": False, "ryan": False, "dylan": "beijing_dialect"}


class TinyTtsSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tiny Qwen3-TTS checkpoint. head_dim 32 (vLLM's CPU attention takes 32/64/128).
    `predictor_hidden` below `talker_hidden`: the released 1.7B's shape (a drawn
    `small_to_mtp_projection`, its bias too); `subtalker`: the code predictor's sampling keys
    written to generation_config.json (None: none, the reference's defaults apply)."""

    variant: str = "custom_voice"  # custom_voice | voice_design | base (tts_model_type)
    seed: int = 0
    tokenizer_vocab: int = 400
    text_vocab: int = 448  # > tokenizer_vocab, like the released model
    text_hidden: int = 64
    talker_hidden: int = 64
    talker_layers: int = 2
    predictor_hidden: int = 64
    predictor_layers: int = 1
    codebook: int = 128
    lm_init_std: float = 0.1  # decisive greedy margins for token-exact comparisons
    subtalker: SubtalkerSampling | None = None


def _mrope(head_dim: int) -> dict[str, Any]:
    """The talker's rope: interleaved M-RoPE sections summing to head_dim / 2 (text only, the
    three position rows are equal, so it is plain RoPE)."""
    half = head_dim // 2
    hw = half * 20 // 64
    return {"rope_type": "default", "mrope_section": [half - 2 * hw, hw, hw], "interleaved": True}


def talker_config(spec: TinyTtsSpec) -> dict[str, Any]:
    cb = spec.codebook
    return {
        "vocab_size": cb + CODEC_SPECIAL_RANGE,
        "hidden_size": spec.talker_hidden,
        "intermediate_size": 2 * spec.talker_hidden,
        "num_hidden_layers": spec.talker_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": _mrope(32),
        "text_vocab_size": spec.text_vocab,
        "text_hidden_size": spec.text_hidden,
        "num_code_groups": NUM_CODE_GROUPS,
        **{k: cb + off for k, off in CODEC_OFFSETS.items()},
        "codec_language_id": {k: cb + off for k, off in LANGUAGE_OFFSETS.items()},
        "spk_id": {k: cb + off for k, off in SPEAKER_OFFSETS.items()} if spec.variant == "custom_voice" else {},
        "spk_is_dialect": dict(SPEAKER_DIALECTS) if spec.variant == "custom_voice" else {},
        "code_predictor_config": {
            "vocab_size": cb,
            "hidden_size": spec.predictor_hidden,
            "intermediate_size": 2 * spec.predictor_hidden,
            "num_hidden_layers": spec.predictor_layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "hidden_act": "silu",
            "max_position_embeddings": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "num_code_groups": NUM_CODE_GROUPS,
        },
    }


SPEAKER_ENCODER = {
    "mel_dim": 128,
    "enc_channels": [32, 32, 32, 32, 96],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 16,
    "enc_res2net_scale": 4,
    "enc_se_channels": 16,
    "sample_rate": 24000,
}


def top_config(spec: TinyTtsSpec, token_ids: dict[str, int]) -> dict[str, Any]:
    """config.json: token ids read from the tiny tokenizer (the released ones where it keeps them)."""
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "1b7",  # the reference drops instructions for "0b6"
        "tts_model_type": spec.variant,
        "talker_config": talker_config(spec),
        "speaker_encoder_config": {**SPEAKER_ENCODER, "enc_dim": spec.talker_hidden},
        **token_ids,
    }


def decoder_config(spec: TinyTtsSpec) -> dict[str, Any]:
    """The 12 Hz codec decoder (released: 1920 samples per frame at 24 kHz, window 72)."""
    return {
        "codebook_size": spec.codebook,
        "codebook_dim": 64,
        "hidden_size": 64,
        "latent_dim": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 128,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01,
        "num_quantizers": NUM_CODE_GROUPS,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
    }


def encoder_config(spec: TinyTtsSpec) -> dict[str, Any]:
    """The Mimi encoder (cloning's reference codes): 1920 samples per frame like the decoder."""
    return {
        "sampling_rate": 24000,
        "hidden_size": 32,
        "num_filters": 8,
        "upsampling_ratios": [8, 6, 5, 4],
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 64,
        "codebook_size": spec.codebook,
        "codebook_dim": 32,
        "vector_quantization_hidden_dimension": 32,
        "num_quantizers": NUM_CODE_GROUPS,
        "num_semantic_quantizers": 1,
        "upsample_groups": 32,
        "frame_rate": 12.5,
        "use_causal_conv": True,
    }


def speech_tokenizer_config(spec: TinyTtsSpec) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": encoder_config(spec),
        "decoder_config": decoder_config(spec),
        "encoder_valid_num_quantizers": NUM_CODE_GROUPS,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
    }

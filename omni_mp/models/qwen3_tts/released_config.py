"""Configs of Qwen3-TTS-12Hz-1.7B-CustomVoice at its released sizes, for a random-weight
checkpoint of that shape (benchmarks.common.checkpoints.qwen3_tts_released_dir): the hub is out
of reach here, so every value is tagged with where it comes from:

  [V] read in qwen-tts 0.1.1 (its config classes' defaults, or the code that reads the value);
  [S] secondhand: the issue's and docs/qwen3_tts.md's facts, vllm-omni 0.25.0rc1's API text
      ("2048-dim for 1.7B" speaker embeddings), or recalled from the released config.json and
      not checked against it.

The qwen-tts defaults describe no released model as a whole (32 code groups, codec ids 4196..):
its talker defaults (hidden 1024) are the 0.6B's width [S]; its code predictor and 12 Hz decoder
defaults are what both sizes ship [S]. What only changes the ids a request carries (codec special
ids, language and speaker ids) is placed in the top 1024 codec ids as the reference requires [V]
at positions that are guesses [S]: the benchmark's timing does not depend on them.

The code predictor is 1024 wide behind `small_to_mtp_projection` (Linear talker 2048 -> 1024
with bias [V: built whenever the widths differ], its width [S]), as our talker serves it.
"""

from __future__ import annotations

from typing import Any

from omni_mp.models.qwen3_omni.tiny import RELEASED_TOKEN_IDS
from omni_mp.models.qwen3_tts.tiny_config import CODEC_SPECIAL_RANGE, NUM_CODE_GROUPS, TinyTtsSpec, decoder_config

TALKER_HIDDEN = 2048  # [S] (vllm-omni: speaker embeddings "2048-dim for 1.7B")
PREDICTOR_HIDDEN = 1024  # [S] (qwen-tts default [V]); under the talker's: small_to_mtp_projection [V]
CODEBOOK = 2048  # [V] code predictor and decoder codebook_size defaults
CODEC_VOCAB = CODEBOOK + CODEC_SPECIAL_RANGE  # 3072 [V default, S]
TEXT_VOCAB = 151936  # [S]
SAMPLE_RATE = 24000  # [V]
SAMPLES_PER_FRAME = 1920  # [V] decode_upsample_rate (12.5 frames a second)
# [S] the 9 preset voices; Dylan speaks Beijing dialect and Eric Sichuan when the language is
# Chinese or auto [S]; their codec ids are placeholders in the special range.
SPEAKERS = ("Vivian", "Serena", "Uncle_Fu", "Dylan", "Eric", "Ryan", "Aiden", "Ono_Anna", "Sohee")
DIALECTS: dict[str, str | bool] = {"Dylan": "beijing_dialect", "Eric": "sichuan_dialect"}
LANGUAGES = ("chinese", "english", "german", "italian", "portuguese", "spanish", "japanese", "korean",
             "french", "russian", "beijing_dialect", "sichuan_dialect")  # fmt: skip  # [S]
CODEC_IDS = {  # [S] recalled positions (in the special range [V])
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}


def _decoder_layer_sizes(hidden: int, inter: int, layers: int, heads: int, kv: int) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 128,  # [V] predictor default; talker [S]
        "hidden_act": "silu",  # [V]
        "rms_norm_eps": 1e-6,  # [V]
    }


def released_talker_config() -> dict[str, Any]:
    """talker_config (with its code_predictor_config) of the 1.7B."""
    return {
        "vocab_size": CODEC_VOCAB,
        **_decoder_layer_sizes(TALKER_HIDDEN, 6144, 28, 16, 8),  # [S] inter 6144, 28 layers, 16/8 heads
        "max_position_embeddings": 32768,  # [V]
        "rope_theta": 1000000.0,  # [S]
        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True},  # [S]
        "text_vocab_size": TEXT_VOCAB,
        "text_hidden_size": 2048,  # [V default, S]
        "num_code_groups": NUM_CODE_GROUPS,  # 16 [S]
        **CODEC_IDS,
        "codec_language_id": {lang: 2050 + i for i, lang in enumerate(LANGUAGES)},
        "spk_id": {name: 3000 + i for i, name in enumerate(SPEAKERS)},
        "spk_is_dialect": {name: DIALECTS.get(name, False) for name in SPEAKERS},
        "code_predictor_config": {
            "vocab_size": CODEBOOK,
            **_decoder_layer_sizes(PREDICTOR_HIDDEN, 3072, 5, 16, 8),  # [V] defaults
            "max_position_embeddings": 65536,
            "rope_theta": 1000000.0,  # [S]
            "num_code_groups": NUM_CODE_GROUPS,
        },
    }


def released_top_config() -> dict[str, Any]:
    """config.json: the Qwen tokenizer's special ids [V defaults], CustomVoice at 1b7."""
    ids = ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id")
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "1b7",
        "tts_model_type": "custom_voice",
        "torch_dtype": "bfloat16",
        "talker_config": released_talker_config(),
        "speaker_encoder_config": {"enc_dim": TALKER_HIDDEN, "sample_rate": SAMPLE_RATE},  # Base only
        **{k: RELEASED_TOKEN_IDS[k] for k in ids},
    }


def released_decoder_config() -> dict[str, Any]:
    """The 12 Hz decoder: qwen-tts's defaults [V] (the shipped tokenizer's sizes [S]) over the
    tiny decoder's config, whose window, rope, quantizers and upsampling are already these;
    codebook_dim has no default there: 512 [S]."""
    sizes = {"codebook_dim": 512, "hidden_size": 1024, "latent_dim": 1024, "num_hidden_layers": 8,
             "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 3072, "decoder_dim": 1536,
             "head_dim": 64}  # fmt: skip  # head_dim: hidden_size / num_attention_heads when absent [V]
    return decoder_config(TinyTtsSpec(codebook=CODEBOOK)) | sizes


def released_speech_tokenizer_config() -> dict[str, Any]:
    """speech_tokenizer/config.json. The Mimi encoder (cloning only: a Base checkpoint's) is
    named by transformers' MimiConfig defaults at 12.5 Hz and not written as weights here."""
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": {
            "sampling_rate": SAMPLE_RATE,
            "frame_rate": 12.5,
            "num_quantizers": 32,
            "upsampling_ratios": [8, 6, 5, 4],
            "codebook_size": CODEBOOK,
        },  # fmt: skip  # [S]
        "decoder_config": released_decoder_config(),
        "encoder_valid_num_quantizers": NUM_CODE_GROUPS,  # [V]
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": SAMPLES_PER_FRAME,
        "encode_downsample_rate": SAMPLES_PER_FRAME,
    }

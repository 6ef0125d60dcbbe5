"""Qwen3-Omni checkpoints in the released Hugging Face layout, built locally with random weights.

- `TinySpec` ("tiny-qwen3-omni"): a whole `Qwen3OmniMoeForConditionalGeneration` at toy size
  (`thinker.*` with audio and vision encoders, `talker.*` with its code predictor,
  `code2wav.*`), saved with `save_pretrained`, plus a processor (a Qwen2Tokenizer trained here
  keeping the released special token strings and role words as single tokens, Whisper
  features at 128 mel bins, Qwen2-VL image/video processors at patch 16, the chat template of
  omni_mp.models.qwen3_omni.chat_template). Every special id in the config is read from that
  tokenizer. Cached like the other tiny models (omni_mp.models.cache).
- `released_config()` / `write_released_shapes()`: the released Qwen3-Omni-30B-A3B shapes, every
  size written here explicitly (transformers' defaults are not the released model's), with
  random weights, for benchmarks.

Tiny-config facts that transformers' defaults get wrong or leave out: the talker's
`shared_expert_intermediate_size` and `spatial_merge_size` must be passed; talker vocab =
codebook size + 1024 with every codec special id in that top range (generate suppresses the
range but codec eos); M-RoPE sections sum to head_dim / 2 (interleaved T/H/W).

Deviations from transformers' default init (the rest is transformers' own, seeded):
- thinker text model, talker and code predictor matrices ~ N(0, `lm_init_std`) instead of 0.02,
  so greedy top-2 logit margins are large enough for token-exact comparisons across engines.
- The talker stops like the released one: on codec eos once the thinker's text is used up. The
  `<tts_pad>` embedding (what the talker is fed after the text) is scaled up so that its
  projection dominates the talker's residual stream, and `codec_head`'s eos row points along
  that projection. The thinker's `lm_head` rows of the special tokens but `<|im_end|>` and of
  the ids past the tokenizer are zero, so the thinker never writes them.
- code2wav: `code2wav_weights.init_code2wav` (transformers' init leaves it nearly silent, rms
  ~3e-7; these weights give audio of rms ~0.1, so a waveform comparison means something).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from omni_mp.models.cache import build_cached
from omni_mp.models.qwen3_omni.chat_template import (
    CHAT_TEMPLATE,
    NAMED_TOKENS,
    ROLES,
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    TTS_BOS,
    TTS_EOS,
    TTS_PAD,
)
from omni_mp.models.qwen3_omni.code2wav_weights import init_code2wav

# Codec special ids as offsets above the codebook (released: codebook 2048, pad 2148, bos 2149,
# eos 2150, nothink 2155, think_bos 2156, think_eos 2157, speakers 2301..2303).
CODEC_OFFSETS = {
    "codec_pad_id": 100,
    "codec_bos_id": 101,
    "codec_eos_token_id": 102,
    "codec_nothink_id": 107,
    "codec_think_bos_id": 108,
    "codec_think_eos_id": 109,
}
SPEAKER_OFFSETS = {"chelsie": 253, "ethan": 254, "aiden": 255}
CODEC_SPECIAL_RANGE = 1024  # talker vocab = codebook + this; generate suppresses all of it but eos
NUM_CODE_GROUPS = 16


class TinySpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole tiny model with its processor. head_dim 32 everywhere (vLLM's CPU attention
    takes 32/64/128)."""

    seed: int = 0
    tokenizer_vocab: int = 400  # BPE trained to exactly this size, special tokens included
    thinker_vocab: int = 448  # > tokenizer_vocab, like the released model (extra ids never written)
    thinker_hidden: int = 64
    thinker_layers: int = 4
    accept_hidden_layer: int = 2  # the released model: 24 of 48
    codebook: int = 128  # code2wav codebook = code predictor vocab; talker vocab = codebook + 1024
    talker_hidden: int = 64
    talker_layers: int = 2
    num_experts: int = 8
    experts_per_tok: int = 2
    lm_init_std: float = 0.1
    # The talker's stop (module docstring): <tts_pad> embedding x tts_pad_embed_scale; codec eos
    # row = eos_code_norm x the unit direction of its projection.
    tts_pad_embed_scale: float = 50.0
    eos_code_norm: float = 0.5


TINY_SPECS: dict[str, TinySpec] = {"tiny-qwen3-omni": TinySpec()}
# Bump when _build_tiny changes without a spec change: the cache is keyed by the spec.
TINY_BUILD = 4  # 4: the chat template's tools; the tool tokens added to the tokenizer

_ROLE_CORPUS = [f"<|im_start|>{role}\nhello there, {role}.<|im_end|>\n" for role in ROLES]


def _mrope(head_dim: int) -> dict[str, Any]:
    """Interleaved M-RoPE sections summing to head_dim / 2 in the released proportions 24:20:20."""
    half = head_dim // 2
    hw = half * 20 // 64
    sections = [half - 2 * hw, hw, hw]
    # transformers always interleaves; vLLM reads `mrope_interleaved` (the released config has both)
    return {
        "rope_type": "default",
        "rope_theta": 1e6,
        "mrope_section": sections,
        "interleaved": True,
        "mrope_interleaved": True,
    }


def _codec_ids(codebook: int) -> dict[str, Any]:
    ids: dict[str, Any] = {name: codebook + off for name, off in CODEC_OFFSETS.items()}
    ids["speaker_id"] = {name: codebook + off for name, off in SPEAKER_OFFSETS.items()}
    return ids


def _tiny_talker(spec: TinySpec, token_ids: dict[str, int], media_ids: dict[str, int]) -> dict[str, Any]:
    """The tiny talker's config (its code predictor inside)."""
    return {
        "text_config": {
            "vocab_size": spec.codebook + CODEC_SPECIAL_RANGE,
            "hidden_size": spec.talker_hidden,
            "intermediate_size": 128,  # also the text/hidden projections' inner size
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "num_hidden_layers": spec.talker_layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "num_experts": spec.num_experts,
            "num_experts_per_tok": spec.experts_per_tok,
            "norm_topk_prob": True,
            "rope_parameters": _mrope(32),
            "max_position_embeddings": 8192,
        },
        "code_predictor_config": {
            "vocab_size": spec.codebook,
            "hidden_size": spec.talker_hidden,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "num_code_groups": NUM_CODE_GROUPS,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            "max_position_embeddings": 8192,
        },
        "num_code_groups": NUM_CODE_GROUPS,
        "thinker_hidden_size": spec.thinker_hidden,
        "accept_hidden_layer": spec.accept_hidden_layer,
        "position_id_per_seconds": 13,
        "spatial_merge_size": 2,
        "audio_start_token_id": token_ids["audio_start_token_id"],
        "vision_start_token_id": token_ids["vision_start_token_id"],
        **media_ids,
        **_codec_ids(spec.codebook),
    }


def _tiny_code2wav(spec: TinySpec) -> dict[str, Any]:
    """The tiny code2wav's config."""
    return {
        "codebook_size": spec.codebook,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "num_quantizers": NUM_CODE_GROUPS,
        "upsample_rates": [8, 5, 4, 3],  # released: 1920 samples per frame at 24 kHz
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def tiny_config(spec: TinySpec, token_ids: dict[str, int]) -> Any:
    """The tiny Qwen3OmniMoeConfig; `token_ids` maps config field names to tokenizer ids."""
    from transformers import Qwen3OmniMoeConfig

    th = spec.thinker_hidden
    media_ids = {k: token_ids[k] for k in ("audio_token_id", "image_token_id", "video_token_id")}
    thinker = {
        "text_config": {
            "vocab_size": spec.thinker_vocab,
            "hidden_size": th,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_hidden_layers": spec.thinker_layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "num_experts": spec.num_experts,
            "num_experts_per_tok": spec.experts_per_tok,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "rope_parameters": _mrope(32),
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
            "eos_token_id": token_ids["im_end_token_id"],
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128,
            "d_model": 64,
            "output_dim": th,
            "n_window": 50,
            "n_window_infer": 800,
            "conv_chunksize": 500,
            "downsample_hidden_size": 32,
            "max_source_positions": 1500,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": th,
            "num_position_embeddings": 2304,
            # vLLM's vision tower reads these (the released config.json has them): its position
            # grid is image_size / patch_size = sqrt(num_position_embeddings) per side.
            "image_size": 768,
            "apply_vit_abs_pos_embed": True,
            "deepstack_visual_indexes": [0, 1],
        },
        "position_id_per_seconds": 13,
        "audio_start_token_id": token_ids["audio_start_token_id"],
        "vision_start_token_id": token_ids["vision_start_token_id"],
        "user_token_id": token_ids["user_token_id"],
        **media_ids,
    }
    talker = _tiny_talker(spec, token_ids, media_ids)
    code2wav = _tiny_code2wav(spec)
    top = {k: token_ids[k] for k in _TOP_IDS}
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True, **top
    )


_TOP_IDS = (
    "im_start_token_id",
    "im_end_token_id",
    "tts_pad_token_id",
    "tts_bos_token_id",
    "tts_eos_token_id",
    "system_token_id",
    "user_token_id",
    "assistant_token_id",
)


def _train_tokenizer(spec: TinySpec, out_dir: Path) -> Any:
    """A Qwen2Tokenizer trained here (byte-level BPE) with the released special tokens, saved
    and reloaded with the named tokens the processor reads."""
    from transformers import Qwen2Tokenizer

    from omni_mp.models.generic.tiny import _corpus

    def corpus() -> Any:
        yield from _corpus()
        for _ in range(400):  # frequent enough that each role word is merged into one token
            yield from _ROLE_CORPUS

    tok = Qwen2Tokenizer().train_new_from_iterator(
        corpus(), vocab_size=spec.tokenizer_vocab, new_special_tokens=list(SPECIAL_TOKENS)
    )
    if len(tok) != spec.tokenizer_vocab:
        raise ValueError(f"tokenizer trained to {len(tok)} tokens, spec asks for {spec.tokenizer_vocab}")
    # The tool tokens after training, as the released tokenizer's added (not special) tokens: the
    # ids of every trained token stay as they were, these take ids past them (the thinker's
    # lm_head rows there are zero, like the released model's unused rows).
    tok.add_tokens(list(TOOL_TOKENS))
    tok.save_pretrained(out_dir)
    tok = Qwen2Tokenizer.from_pretrained(
        out_dir, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=32768, **NAMED_TOKENS
    )
    for role in ROLES:
        if len(tok(role)["input_ids"]) != 1:
            raise ValueError(f"role word {role!r} is not one token of the trained tokenizer")
    return tok


def _token_ids(tok: Any) -> dict[str, int]:
    tid = tok.convert_tokens_to_ids
    return {
        "audio_token_id": tid("<|audio_pad|>"),
        "image_token_id": tid("<|image_pad|>"),
        "video_token_id": tid("<|video_pad|>"),
        "audio_start_token_id": tid("<|audio_start|>"),
        "vision_start_token_id": tid("<|vision_start|>"),
        "im_start_token_id": tid("<|im_start|>"),
        "im_end_token_id": tid("<|im_end|>"),
        "tts_pad_token_id": tid(TTS_PAD),
        "tts_bos_token_id": tid(TTS_BOS),
        "tts_eos_token_id": tid(TTS_EOS),
        **{f"{role}_token_id": tok(role)["input_ids"][0] for role in ROLES},
    }


def _save_processor(tok: Any, out_dir: Path) -> None:
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        Qwen3OmniMoeProcessor,
        WhisperFeatureExtractor,
    )

    Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2),
        video_processor=Qwen2VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tok,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(out_dir)


def _build_tiny(spec: TinySpec, out_dir: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    tok = _train_tokenizer(spec, out_dir)
    ids = _token_ids(tok)
    config = tiny_config(spec, ids)
    torch.manual_seed(spec.seed)  # transformers' own init draws from the global RNG
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for part in (model.thinker.model, model.thinker.lm_head, model.talker):
            for _, p in sorted(part.named_parameters()):
                if p.ndim >= 2:
                    p.normal_(0.0, spec.lm_init_std, generator=gen)
        tid = tok.convert_tokens_to_ids
        model.thinker.lm_head.weight[[tid(t) for t in SPECIAL_TOKENS if t != "<|im_end|>"]] = 0.0
        model.thinker.lm_head.weight[spec.tokenizer_vocab :] = 0.0
        pad = model.thinker.get_input_embeddings().weight[ids["tts_pad_token_id"]]
        pad *= spec.tts_pad_embed_scale
        direction = model.talker.text_projection(pad)
        eos = spec.codebook + CODEC_OFFSETS["codec_eos_token_id"]
        model.talker.codec_head.weight[eos] = spec.eos_code_norm * direction / direction.norm()
    init_code2wav(model.code2wav, spec.seed)  # audible: transformers' init is nearly silent
    model.generation_config = GenerationConfig(eos_token_id=ids["im_end_token_id"], pad_token_id=tid("<|endoftext|>"))
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_processor(tok, out_dir)


def build_tiny(spec: TinySpec, cache_dir: Path | None = None, *, verbose: bool = True) -> Path:
    """The tiny Qwen3-Omni checkpoint dir (model and processor) for `spec`, built once and cached."""
    return build_cached(
        f"qwen3_omni-b{TINY_BUILD}", spec, lambda out: _build_tiny(spec, out), cache_dir=cache_dir, verbose=verbose
    )


def build_named(name: str) -> Path:
    """The checkpoint dir of a built-in Qwen3-Omni spec name (of TINY_SPECS)."""
    return build_tiny(TINY_SPECS[name])


# ---- the released 30B-A3B shapes (benchmarks) ----

# The released tokenizer's ids (Qwen3 vocabulary) that the config names.
RELEASED_TOKEN_IDS = {
    "audio_token_id": 151675,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "audio_start_token_id": 151669,
    "vision_start_token_id": 151652,
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
    "system_token_id": 8948,
    "user_token_id": 872,
    "assistant_token_id": 77091,
}


# The released code2wav's config (it names no token ids).
_RELEASED_CODE2WAV: dict[str, Any] = {
    "codebook_size": 2048,
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 3072,
    "sliding_window": 72,
    "max_position_embeddings": 8000,
    "num_quantizers": NUM_CODE_GROUPS,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 1536,
    "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def _released_talker(ids: dict[str, int], media_ids: dict[str, int], mrope: dict[str, Any]) -> dict[str, Any]:
    """The released talker's config (its code predictor inside)."""
    return {
        "text_config": {
            "vocab_size": 3072,
            "hidden_size": 1024,
            "intermediate_size": 2048,
            "moe_intermediate_size": 384,
            "shared_expert_intermediate_size": 768,
            "num_hidden_layers": 20,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 6,
            "norm_topk_prob": True,
            "rms_norm_eps": 1e-6,
            "rope_parameters": mrope,
            "max_position_embeddings": 65536,
        },
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 5,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "num_code_groups": NUM_CODE_GROUPS,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            "max_position_embeddings": 32768,
        },
        "num_code_groups": NUM_CODE_GROUPS,
        "thinker_hidden_size": 2048,
        "accept_hidden_layer": 24,
        "position_id_per_seconds": 13,
        "spatial_merge_size": 2,
        "audio_start_token_id": ids["audio_start_token_id"],
        "vision_start_token_id": ids["vision_start_token_id"],
        **media_ids,
        **_codec_ids(2048),
    }


def released_config() -> Any:
    """Qwen3OmniMoeConfig at the released Qwen3-Omni-30B-A3B-Instruct shapes, every size explicit."""
    from transformers import Qwen3OmniMoeConfig

    ids = RELEASED_TOKEN_IDS
    mrope = {
        "rope_type": "default",
        "rope_theta": 1e6,
        "mrope_section": [24, 20, 20],
        "interleaved": True,
        "mrope_interleaved": True,
    }
    media_ids = {k: ids[k] for k in ("audio_token_id", "image_token_id", "video_token_id")}
    thinker = {
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": 2048,
            "intermediate_size": 768,
            "moe_intermediate_size": 768,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "rms_norm_eps": 1e-6,
            "rope_parameters": mrope,
            "max_position_embeddings": 65536,
            "tie_word_embeddings": False,
            "eos_token_id": ids["im_end_token_id"],
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 32,
            "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "d_model": 1280,
            "output_dim": 2048,
            "n_window": 50,
            "n_window_infer": 800,
            "conv_chunksize": 500,
            "downsample_hidden_size": 480,
            "max_source_positions": 1500,
        },
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_heads": 16,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 2048,
            "num_position_embeddings": 2304,
            "image_size": 768,
            "apply_vit_abs_pos_embed": True,
            "deepstack_visual_indexes": [8, 16, 24],
        },
        "position_id_per_seconds": 13,
        "audio_start_token_id": ids["audio_start_token_id"],
        "vision_start_token_id": ids["vision_start_token_id"],
        "user_token_id": ids["user_token_id"],
        **media_ids,
    }
    talker = _released_talker(ids, media_ids, mrope)
    code2wav = dict(_RELEASED_CODE2WAV)
    top = {k: ids[k] for k in _TOP_IDS}
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True, **top
    )


def write_released_shapes(out_dir: Path, *, seed: int = 0, std: float = 0.02, dtype: str = "bfloat16") -> Path:
    """A checkpoint dir at the released shapes with random weights (N(0, std) matrices, ones
    for norms, zeros for biases): config.json and safetensors shards written one module at a
    time (the model is built on the meta device; 65.7 GB in bf16 at the released sizes)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3OmniMoeForConditionalGeneration

    out_dir.mkdir(parents=True, exist_ok=True)
    config = released_config()
    config.torch_dtype = dtype
    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(config)
    gen = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, n_shard = 0, 0
    limit = 4 << 30

    def flush() -> None:
        nonlocal shard, shard_bytes, n_shard
        if shard:
            name = f"model-{n_shard:05d}.safetensors"
            save_file(shard, str(out_dir / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
            shard, shard_bytes, n_shard = {}, 0, n_shard + 1

    for name, p in model.named_parameters():
        t = torch.empty(p.shape, dtype=getattr(torch, dtype))
        if p.ndim == 1:
            t.fill_(1.0 if "norm" in name else 0.0)
        else:
            t.normal_(0.0, std, generator=gen)
        shard[name] = t
        shard_bytes += t.numel() * t.element_size()
        if shard_bytes >= limit:
            flush()
    flush()
    config.save_pretrained(out_dir)
    (out_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out_dir

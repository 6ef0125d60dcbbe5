"""Tiny random Qwen2.5-Omni checkpoints in the real Hugging Face layout, built locally.

A checkpoint is a full `Qwen2_5OmniForConditionalGeneration` saved with `save_pretrained`
(`thinker.*` with audio and vision encoders, `talker.*`, `token2wav.*`, `config.json`) plus
`spk_dict.pt` (`{name: {"bos_token", "cond" [1, enc_emb_dim], "ref_mel" [1, T_ref, mel_dim]}}`),
at toy sizes (docs/qwen2_5_omni.md). Cached like the other tiny models
(omni_mp.models.cache). Nothing at run time imports this module: omni_mp.models.registry
imports it when a stage names one of its built-in checkpoints. Two kinds:

- `Token2WavSpec` ("tiny-token2wav", "token2wav-default-size"): for the token2wav (diffusion)
  stage alone; fixed special ids, no processor.
- `OmniSpec` ("tiny-qwen2_5-omni"): the whole model, plus a processor (a Qwen2Tokenizer trained
  here, Whisper features at 128 mel bins, Qwen2-VL image/video processors, the chat template
  of omni_mp.models.qwen2_5_omni.prompt);
  every special id in the configs and `spk_dict.pt` is read from that tokenizer.

Deviations from transformers' default init (the rest is transformers' own, seeded):
- DiT matrices ~ N(0, `dit_init_std`=0.12) instead of 0.02: at 0.02 the random DiT barely mixes
  frames, so chunked (windowed) token2wav could not differ from the one-shot pass.
- BigVGAN convs get PyTorch's conv init (uniform +-1/sqrt(fan_in)): the default is near-silent.
- OmniSpec: thinker text model and talker decoder matrices ~ N(0, `lm_init_std`) instead of 0.02,
  so greedy top-2 logit margins are large enough for token-exact comparisons across engines.
- OmniSpec: the talker stops like the real one, on codec pad once the thinker's text is used up.
  The `<|tts_pad|>` embedding (what the talker is fed after the text) is scaled up so that it
  dominates the talker's residual stream, and the codec pad row of `codec_head` points along its
  projection; the end row is scaled down. A random head instead stops at step 0 or never,
  depending on the prompt (measured at scales 0.8, 1, 1.2, 1.5). The thinker's `lm_head` rows of the
  special tokens but `<|im_end|>` and of the ids past the tokenizer are zero, so the thinker
  never writes them (a `<|tts_pad|>` in the reply would stop the talker early).
Other deviations: `num_embeds` (DiT codec vocab) covers every id an upstream stage can emit
(tiny-qwen2's 320, or the talker's codec vocab); speakers get reference mels of different
lengths, so batching across speakers is exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from omni_mp.models.cache import build_cached
from omni_mp.models.qwen2_5_omni.prompt import CHAT_TEMPLATE


class Token2WavSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    seed: int = 0
    dit_hidden: int = 64
    dit_layers: int = 2
    dit_heads: int = 2
    num_embeds: int = 320  # codec ids 0..num_embeds are valid (the embedding has num_embeds + 1 rows)
    mel_dim: int = 80
    block_size: int = 24  # mel frames per attention block (= 12 codes at repeats 2)
    look_ahead_layers: tuple[int, ...] = (1,)
    look_backward_layers: tuple[int, ...] = (0,)
    enc_emb_dim: int = 16
    bigvgan_channels: int = 64
    # DiT matrices ~ N(0, std). At transformers' 0.02 the random DiT barely mixes frames (a
    # change in one block moves the next block's output by ~1e-5), so windows could not differ
    # from the one-shot pass; at 0.12 neighbouring blocks move each other by ~10-100%.
    dit_init_std: float = 0.12
    # name -> reference mel length (frames)
    speakers: tuple[tuple[str, int], ...] = (("Chelsie", 60), ("Ethan", 90))
    # True: token2wav at transformers' default (real Qwen2.5-Omni) size, with transformers' own
    # random init; the fields above except seed and speakers are ignored. For benchmarks.
    default_size: bool = False


CODEC_VOCAB = 128  # talker codec vocab of the tiny omni model
# Talker codec ids (tts_codec_*_token_id) of the tiny omni model, all < CODEC_VOCAB.
CODEC_PAD, CODEC_BOS, CODEC_END, CODEC_MASK = 122, 123, 124, 126
CODEC_STOP_IDS = (CODEC_PAD, CODEC_END)  # generate()'s talker_eos_token_id: codec pad *and* end stop


class OmniSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole tiny model with its processor. Token2wav sizes come from `token2wav` (whose own
    `seed` is unused: `seed` seeds everything)."""

    seed: int = 0
    tokenizer_vocab: int = 320  # BPE trained to exactly this size, special tokens included
    thinker_vocab: int = 352  # > tokenizer_vocab, like the real model (the extra ids are never written)
    # Thinker text model and talker decoder matrices ~ N(0, std); at 0.02 greedy top-2 margins
    # are ~1e-3, too close for token-exact comparisons across engines.
    lm_init_std: float = 0.1
    # The talker's stop (module docstring): <|tts_pad|> embedding x tts_pad_embed_scale (norm ~40
    # vs ~1 for the other talker inputs); codec pad row = pad_code_norm x the unit direction of
    # its projection (logit ~4.5 after the text vs ~2.5 for the best random row); end row x
    # end_code_scale (rare). Measured: 48 codes for 48 thinker tokens on text/audio/image prompts.
    tts_pad_embed_scale: float = 50.0
    pad_code_norm: float = 0.5
    end_code_scale: float = 0.5
    token2wav: Token2WavSpec = Token2WavSpec(num_embeds=CODEC_VOCAB)  # every codec id is a valid DiT id


TOKEN2WAV_SPECS: dict[str, Token2WavSpec] = {
    "tiny-token2wav": Token2WavSpec(),
    "token2wav-default-size": Token2WavSpec(default_size=True, speakers=(("Chelsie", 300), ("Ethan", 300))),
}
OMNI_SPECS: dict[str, OmniSpec] = {"tiny-qwen2_5-omni": OmniSpec()}
# Bump when _build_omni changes without a spec change: the cache is keyed by the spec.
OMNI_BUILD = 2

# The real Qwen2.5-Omni token strings. The talker's text ids (tts_text_start/end/pad) and the
# speakers' bos tokens get tokens of their own (the real ones are ids past the tokenizer).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
    "<|tts_pad|>",
]
# Qwen2_5OmniProcessor reads these named tokens from the tokenizer.
_NAMED_TOKENS = {
    "audio_token": "<|AUDIO|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}


def speaker_token(name: str) -> str:
    return f"<|spk_{name}|>"


_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
# Thinker-vocab ids of the special tokens of the token2wav-only checkpoints (all < vocab 320).
_SPECIAL_IDS = {
    "audio_token_index": 300,
    "image_token_index": 301,
    "video_token_index": 302,
    "vision_start_token_id": 303,
    "vision_end_token_id": 304,
    "audio_start_token_id": 305,
    "audio_end_token_id": 306,
}
_T2W_TTS_IDS = {"tts_text_start_token_id": 307, "tts_text_end_token_id": 308, "tts_text_pad_token_id": 309}


def omni_config(
    spec: Token2WavSpec,
    special_ids: dict[str, int] | None = None,
    tts_ids: dict[str, int] | None = None,
    thinker_vocab: int = 320,
    eos_token_id: int | None = None,
) -> Any:
    """The tiny Qwen2_5OmniConfig. `special_ids` (thinker and talker) and `tts_ids` (talker)
    default to the fixed ids of the token2wav-only checkpoints."""
    from transformers import Qwen2_5OmniConfig

    special_ids = _SPECIAL_IDS if special_ids is None else special_ids
    tts_ids = _T2W_TTS_IDS if tts_ids is None else tts_ids
    return Qwen2_5OmniConfig(
        thinker_config=_thinker_config(special_ids, thinker_vocab, eos_token_id),
        talker_config=_talker_config(special_ids, tts_ids),
        token2wav_config={} if spec.default_size else _token2wav_config(spec),
        enable_audio_output=True,
    )


def _thinker_config(special_ids: dict[str, int], thinker_vocab: int, eos_token_id: int | None) -> dict[str, Any]:
    text = {
        "vocab_size": thinker_vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rope_parameters": _MROPE,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
    }
    if eos_token_id is not None:
        text["eos_token_id"] = eos_token_id  # saved into the generation config: the thinker stops on it
    thinker = {
        "text_config": text,
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "d_model": 64,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128,
            "output_dim": 64,
            "n_window": 100,
            "max_source_positions": 1500,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 64,
            "num_heads": 2,
            "intermediate_size": 128,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
            "window_size": 112,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        **special_ids,
    }
    return thinker


def _talker_config(special_ids: dict[str, int], tts_ids: dict[str, int]) -> dict[str, Any]:
    return {
        "vocab_size": CODEC_VOCAB,
        "embedding_size": 64,
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "rope_parameters": _MROPE,
        "tts_codec_pad_token_id": CODEC_PAD,
        "tts_codec_start_token_id": CODEC_BOS,
        "tts_codec_end_token_id": CODEC_END,
        "tts_codec_mask_token_id": CODEC_MASK,
        **tts_ids,
        **special_ids,
    }


def _token2wav_config(spec: Token2WavSpec) -> dict[str, Any]:
    dit = {
        "hidden_size": spec.dit_hidden,
        "num_hidden_layers": spec.dit_layers,
        "num_attention_heads": spec.dit_heads,
        "head_dim": spec.dit_hidden // spec.dit_heads,
        "ff_mult": 2,
        "emb_dim": 32,
        "num_embeds": spec.num_embeds,
        "mel_dim": spec.mel_dim,
        "repeats": 2,
        "block_size": spec.block_size,
        "look_ahead_layers": list(spec.look_ahead_layers),
        "look_backward_layers": list(spec.look_backward_layers),
        "enc_emb_dim": spec.enc_emb_dim,
        "enc_dim": 16,
        "enc_channels": [32, 32, 32, 32, 96],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 16,
        "enc_res2net_scale": 2,
        "enc_se_channels": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
    }
    bigvgan = {
        "mel_dim": spec.mel_dim,
        "upsample_initial_channel": spec.bigvgan_channels,
        "upsample_rates": [5, 3, 2, 2, 2, 2],
        "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
    }
    return {"dit_config": dit, "bigvgan_config": bigvgan}


def _random_model(config: Any, seed: int, t2w: Token2WavSpec) -> tuple[Any, Any]:
    """transformers' init seeded with `seed`, then token2wav re-initialised (see the module
    docstring); returns the model and the generator, for later deterministic draws."""
    import torch
    from transformers import Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)  # transformers' own init draws from the global RNG
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.token2wav.code2wav_dit_model.named_parameters()):
            if p.ndim >= 2 and ".spk_encoder." not in name and not t2w.default_size:
                p.normal_(0.0, t2w.dit_init_std, generator=gen)
        # BigVGAN's default init is near-silent (wav std ~5e-9); a conv-style init gives audible output.
        for mod in model.token2wav.code2wav_bigvgan_model.modules():
            if isinstance(mod, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                bound = (1.0 / (mod.weight.shape[1] * mod.weight.shape[2])) ** 0.5
                mod.weight.uniform_(-bound, bound, generator=gen)
                if mod.bias is not None:
                    mod.bias.uniform_(-bound, bound, generator=gen)
    return model, gen


def _save_speakers(out_dir: Path, config: Any, t2w: Token2WavSpec, bos_ids: list[int], gen: Any) -> None:
    import torch

    dit = config.token2wav_config.dit_config
    speakers = {
        name: {
            "bos_token": bos,
            "cond": torch.randn(1, dit.enc_emb_dim, generator=gen),
            "ref_mel": torch.randn(1, frames, dit.mel_dim, generator=gen) - 5.0,  # log-mel-like values
        }
        for (name, frames), bos in zip(t2w.speakers, bos_ids, strict=True)
    }
    torch.save(speakers, out_dir / "spk_dict.pt")


def _build(spec: Token2WavSpec, out_dir: Path) -> None:
    config = omni_config(spec)
    model, gen = _random_model(config, spec.seed, spec)
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_speakers(out_dir, config, spec, [310 + i for i in range(len(spec.speakers))], gen)


def build_token2wav(spec: Token2WavSpec, cache_dir: Path | None = None, *, verbose: bool = True) -> Path:
    """The checkpoint dir for `spec`, built once and cached."""
    return build_cached("qwen2_5_omni-t2w", spec, lambda out: _build(spec, out), cache_dir=cache_dir, verbose=verbose)


def _train_tokenizer(spec: OmniSpec, out_dir: Path) -> Any:
    """A Qwen2Tokenizer trained here (byte-level BPE) with the Omni special tokens, saved and
    reloaded with the named tokens the processor reads."""
    from transformers import Qwen2Tokenizer

    from omni_mp.models.generic.tiny import _corpus

    specials = SPECIAL_TOKENS + [speaker_token(name) for name, _ in spec.token2wav.speakers]
    tok = Qwen2Tokenizer().train_new_from_iterator(
        _corpus(), vocab_size=spec.tokenizer_vocab, new_special_tokens=specials
    )
    if len(tok) != spec.tokenizer_vocab:
        raise ValueError(f"tokenizer trained to {len(tok)} tokens, spec asks for {spec.tokenizer_vocab}")
    tok.save_pretrained(out_dir)
    return Qwen2Tokenizer.from_pretrained(
        out_dir, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=32768, **_NAMED_TOKENS
    )


def _save_processor(tok: Any, out_dir: Path) -> None:
    from transformers import Qwen2_5OmniProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor, WhisperFeatureExtractor

    Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(),
        video_processor=Qwen2VLVideoProcessor(),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),  # Omni's audio tower takes 128 mel bins
        tokenizer=tok,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(out_dir)


def _build_omni(spec: OmniSpec, out_dir: Path) -> None:
    import torch

    tok = _train_tokenizer(spec, out_dir)
    tid = tok.convert_tokens_to_ids
    special_ids = {
        "audio_token_index": tid("<|AUDIO|>"),
        "image_token_index": tid("<|IMAGE|>"),
        "video_token_index": tid("<|VIDEO|>"),
        "vision_start_token_id": tid("<|vision_bos|>"),
        "vision_end_token_id": tid("<|vision_eos|>"),
        "audio_start_token_id": tid("<|audio_bos|>"),
        "audio_end_token_id": tid("<|audio_eos|>"),
    }
    tts_ids = {
        "tts_text_start_token_id": tid("<|tts_bos|>"),
        "tts_text_end_token_id": tid("<|tts_eos|>"),
        "tts_text_pad_token_id": tid("<|tts_pad|>"),
    }
    t2w = spec.token2wav
    config = omni_config(t2w, special_ids, tts_ids, spec.thinker_vocab, eos_token_id=tid("<|im_end|>"))
    model, gen = _random_model(config, spec.seed, t2w)
    with torch.no_grad():
        for part in (model.thinker.model, model.thinker.lm_head, model.talker):
            for _, p in sorted(part.named_parameters()):
                if p.ndim >= 2:
                    p.normal_(0.0, spec.lm_init_std, generator=gen)
        # Logit 0 never wins over ~350 random logits: like the real thinker, it writes no special
        # token but <|im_end|> (a <|tts_pad|> would stop the talker, a <|AUDIO|> is a placeholder)
        # and no id past the tokenizer (it would not detokenize).
        specials = SPECIAL_TOKENS + [speaker_token(name) for name, _ in t2w.speakers]
        model.thinker.lm_head.weight[[tid(t) for t in specials if t != "<|im_end|>"]] = 0.0
        model.thinker.lm_head.weight[spec.tokenizer_vocab :] = 0.0
        tts_pad = model.thinker.get_input_embeddings().weight[tts_ids["tts_text_pad_token_id"]]
        tts_pad *= spec.tts_pad_embed_scale
        direction = model.talker.thinker_to_talker_proj.weight @ tts_pad
        model.talker.codec_head.weight[CODEC_PAD] = spec.pad_code_norm * direction / direction.norm()
        model.talker.codec_head.weight[CODEC_END] *= spec.end_code_scale
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_speakers(out_dir, config, t2w, [tid(speaker_token(name)) for name, _ in t2w.speakers], gen)
    _save_processor(tok, out_dir)


def build_omni(spec: OmniSpec, cache_dir: Path | None = None, *, verbose: bool = True) -> Path:
    """The full tiny Qwen2.5-Omni checkpoint dir (model, spk_dict.pt, processor) for `spec`,
    built once and cached."""
    return build_cached(
        f"qwen2_5_omni-b{OMNI_BUILD}", spec, lambda out: _build_omni(spec, out), cache_dir=cache_dir, verbose=verbose
    )


def build_named(name: str) -> Path:
    """The checkpoint dir of a built-in Qwen2.5-Omni spec name (of TOKEN2WAV_SPECS or OMNI_SPECS)."""
    if name in TOKEN2WAV_SPECS:
        return build_token2wav(TOKEN2WAV_SPECS[name])
    return build_omni(OMNI_SPECS[name])

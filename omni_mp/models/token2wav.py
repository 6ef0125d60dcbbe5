"""A tiny random Qwen2.5-Omni checkpoint for the token2wav (diffusion) stage, built locally.

It has the real Hugging Face layout: a full `Qwen2_5OmniForConditionalGeneration` saved with
`save_pretrained` (thinker, talker and `token2wav.*` keys, `config.json`) plus `spk_dict.pt`
(`{name: {"bos_token", "cond" [1, enc_emb_dim], "ref_mel" [1, T_ref, mel_dim]}}`), at toy sizes
(`../shared/models/qwen2_5_omni.md` §4). Cached like the other tiny models (omni_mp.models.tiny).

Deviations from those sizes, all for the tests: larger DiT weights (see `dit_init_std`);
`num_embeds` = 320, so every id of the tiny Qwen2 AR model (vocab 320) is a valid codec id;
speakers get reference mels of different lengths, so batching across speakers is exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from omni_mp.models.tiny import build_cached


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


TOKEN2WAV_SPECS: dict[str, Token2WavSpec] = {
    "tiny-token2wav": Token2WavSpec(),
    "token2wav-default-size": Token2WavSpec(default_size=True, speakers=(("Chelsie", 300), ("Ethan", 300))),
}

_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
# Thinker-vocab ids of the special tokens (all < thinker vocab 320).
_SPECIAL_IDS = {
    "audio_token_index": 300,
    "image_token_index": 301,
    "video_token_index": 302,
    "vision_start_token_id": 303,
    "vision_end_token_id": 304,
    "audio_start_token_id": 305,
    "audio_end_token_id": 306,
}


def omni_config(spec: Token2WavSpec) -> Any:
    from transformers import Qwen2_5OmniConfig

    thinker = {
        "text_config": {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "rope_parameters": _MROPE,
            "tie_word_embeddings": False,
            "max_position_embeddings": 4096,
        },
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
        **_SPECIAL_IDS,
    }
    talker = {
        "vocab_size": 128,
        "embedding_size": 64,
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "rope_parameters": _MROPE,
        "tts_codec_pad_token_id": 122,
        "tts_codec_start_token_id": 123,
        "tts_codec_end_token_id": 124,
        "tts_codec_mask_token_id": 126,
        "tts_text_start_token_id": 307,
        "tts_text_end_token_id": 308,
        "tts_text_pad_token_id": 309,
        **_SPECIAL_IDS,
    }
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
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config={} if spec.default_size else {"dit_config": dit, "bigvgan_config": bigvgan},
        enable_audio_output=True,
    )


def _build(spec: Token2WavSpec, out_dir: Path) -> None:
    import torch
    from transformers import Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(spec.seed)  # transformers' own init draws from the global RNG
    config = omni_config(spec)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in sorted(model.token2wav.code2wav_dit_model.named_parameters()):
            if p.ndim >= 2 and ".spk_encoder." not in name and not spec.default_size:
                p.normal_(0.0, spec.dit_init_std, generator=gen)
        # BigVGAN's default init is near-silent (wav std ~5e-9); a conv-style init gives audible output.
        for mod in model.token2wav.code2wav_bigvgan_model.modules():
            if isinstance(mod, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                bound = (1.0 / (mod.weight.shape[1] * mod.weight.shape[2])) ** 0.5
                mod.weight.uniform_(-bound, bound, generator=gen)
                if mod.bias is not None:
                    mod.bias.uniform_(-bound, bound, generator=gen)
    model.save_pretrained(out_dir, safe_serialization=True)
    dit = config.token2wav_config.dit_config
    speakers = {
        name: {
            "bos_token": 310 + i,
            "cond": torch.randn(1, dit.enc_emb_dim, generator=gen),
            "ref_mel": torch.randn(1, frames, dit.mel_dim, generator=gen) - 5.0,  # log-mel-like values
        }
        for i, (name, frames) in enumerate(spec.speakers)
    }
    torch.save(speakers, out_dir / "spk_dict.pt")


def build_token2wav(spec: Token2WavSpec, cache_dir: Path | None = None, *, verbose: bool = True) -> Path:
    """The checkpoint dir for `spec`, built once and cached."""
    return build_cached("qwen2_5_omni-t2w", spec, lambda out: _build(spec, out), cache_dir=cache_dir, verbose=verbose)

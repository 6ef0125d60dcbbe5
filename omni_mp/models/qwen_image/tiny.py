"""A tiny random Qwen-Image checkpoint in diffusers' layout, built locally (nothing from a hub).

The directory is what `QwenImagePipeline.from_pretrained(dir)` loads (the oracle) and what
our stages load: `model_index.json`, `scheduler/` (Qwen-Image's flow-match settings),
`text_encoder/` (a `Qwen2_5_VLForConditionalGeneration` with a toy vision tower and a text
model of head_dim 32, the smallest vLLM's CPU attention takes), `tokenizer/` (a Qwen2Tokenizer
trained here with Qwen2.5-VL's special tokens, on a corpus holding the prompt template, so
that the template's system part is exactly 34 tokens as with the real tokenizer),
`transformer/` (`QwenImageTransformer2DModel`, 2 blocks) and `vae/` (`AutoencoderKLQwenImage`,
8x downscale, 16 latent channels). A `config.json` at the top (the text model's) lets a
stage's `model:` name the directory like any checkpoint. Cached like the other tiny models.

Deviation from the libraries' default init: DiT and text-model matrices ~ N(0, `init_std`)
(at 0.02 a 2-block DiT barely moves the latents, so per-step differences would not show);
VAE matrices uniform +-1/sqrt(fan_in) (seeded, independent of the library's init order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from omni_mp.models.cache import build_cached
from omni_mp.models.qwen_image.prompt import TEMPLATE, TEMPLATE_DROP

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen-Image's scheduler settings (flow match, exponential dynamic shift, terminal 0.02).
SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}


class TinyQwenImageSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    seed: int = 0
    tokenizer_vocab: int = 420
    text_hidden: int = 64  # 2 heads x 32
    text_layers: int = 2
    dit_layers: int = 2
    dit_heads: int = 2
    dit_head_dim: int = 32
    rope_axes: tuple[int, int, int] = (8, 12, 12)  # sums to dit_head_dim
    vae_base_dim: int = 8
    init_std: float = 0.08


SPECS: dict[str, TinyQwenImageSpec] = {"tiny-qwen-image": TinyQwenImageSpec()}
# Bump when _build changes without a spec change: the cache is keyed by the spec.
BUILD = 1


def _corpus() -> Any:
    from omni_mp.models.generic.tiny import _corpus as base

    template = TEMPLATE.format("a red cube on a blue table, a cat beside it")
    for line in base():
        yield line
        yield template


def _tokenizer(spec: TinyQwenImageSpec, out_dir: Path) -> Any:
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(
        _corpus(), vocab_size=spec.tokenizer_vocab, new_special_tokens=SPECIAL_TOKENS
    )
    tok.save_pretrained(out_dir)
    tok = Qwen2Tokenizer.from_pretrained(out_dir, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.model_max_length = 32768
    tok.save_pretrained(out_dir)
    prefix = tok(TEMPLATE.split("{}")[0]).input_ids
    if len(prefix) != TEMPLATE_DROP:
        raise ValueError(f"the tiny tokenizer splits the template's system part into {len(prefix)} tokens, not 34")
    return tok


def _text_encoder(spec: TinyQwenImageSpec, tok: Any, gen: Any) -> Any:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tid = tok.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": spec.text_hidden,
            "intermediate_size": 2 * spec.text_hidden,
            "num_hidden_layers": spec.text_layers,
            "num_attention_heads": spec.text_hidden // 32,
            "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
            "bos_token_id": tid("<|endoftext|>"),
            "eos_token_id": tid("<|im_end|>"),
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": spec.text_hidden,
            "fullatt_block_indexes": [0],
        },
        image_token_id=tid("<|image_pad|>"),
        video_token_id=tid("<|video_pad|>"),
        vision_start_token_id=tid("<|vision_start|>"),
        vision_end_token_id=tid("<|vision_end|>"),
        torch_dtype="float32",
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.ndim >= 2:
                p.normal_(0.0, spec.init_std, generator=gen)
    return model


def _transformer(spec: TinyQwenImageSpec, gen: Any) -> Any:
    import torch
    from diffusers import QwenImageTransformer2DModel

    if sum(spec.rope_axes) != spec.dit_head_dim:
        raise ValueError("rope_axes must sum to dit_head_dim")
    model = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=spec.dit_layers,
        attention_head_dim=spec.dit_head_dim,
        num_attention_heads=spec.dit_heads,
        joint_attention_dim=spec.text_hidden,
        axes_dims_rope=spec.rope_axes,
    ).eval()
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.ndim >= 2:
                p.normal_(0.0, spec.init_std, generator=gen)
    return model


def _vae(spec: TinyQwenImageSpec, gen: Any) -> Any:
    import torch
    from diffusers import AutoencoderKLQwenImage

    model = AutoencoderKLQwenImage(
        base_dim=spec.vae_base_dim,
        z_dim=16,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()
    with torch.no_grad():  # seeded, independent of the library's init order
        for _, p in sorted(model.named_parameters()):
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.uniform_(-(fan_in**-0.5), fan_in**-0.5, generator=gen)
    return model


def _build(spec: TinyQwenImageSpec, out_dir: Path) -> None:
    import json

    import torch

    gen = torch.Generator().manual_seed(spec.seed)
    tok = _tokenizer(spec, out_dir / "tokenizer")
    text = _text_encoder(spec, tok, gen)
    text.save_pretrained(out_dir / "text_encoder", safe_serialization=True)
    _transformer(spec, gen).save_pretrained(out_dir / "transformer", safe_serialization=True)
    _vae(spec, gen).save_pretrained(out_dir / "vae", safe_serialization=True)
    (out_dir / "scheduler").mkdir()
    (out_dir / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER_CONFIG, indent=2))
    index = {
        "_class_name": "QwenImagePipeline",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "QwenImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }
    (out_dir / "model_index.json").write_text(json.dumps(index, indent=2))
    # The text model's config at the top: the dir reads as a checkpoint to the rest of omni_mp.
    (out_dir / "config.json").write_text((out_dir / "text_encoder" / "config.json").read_text())


def build_tiny(spec: TinyQwenImageSpec, cache_dir: Path | None = None, *, verbose: bool = True) -> Path:
    return build_cached(
        f"qwen_image-b{BUILD}", spec, lambda out: _build(spec, out), cache_dir=cache_dir, verbose=verbose
    )


def build_named(name: str) -> Path:
    return build_tiny(SPECS[name])

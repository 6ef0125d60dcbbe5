"""The Qwen-Image checkpoint dir at its real sizes with random weights (diffusers' layout), which
omni_mp's pipeline and diffusers' QwenImagePipeline both load: sizes written here, never taken
from library defaults (the text encoder is Qwen2.5-VL-7B's language model; the DiT has 60 MMDiT
blocks, 24 heads x 128, joint attention 3584; the VAE base 96, z 16). The DiT's and the VAE's
random bf16 tensors are written (~42 GB); the text encoder has only its config (vLLM builds it
with `load_format: dummy`, diffusers randomly in memory). The tokenizer and scheduler are the
tiny checkpoint's (trained locally: nothing is fetched). `shrink`: the same path at toy widths,
fp32, which a CPU runs (a check of the code, not a measurement)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

# Qwen2.5-VL-7B's language model (the text encoder), written out: transformers' defaults differ.
TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
}
# Qwen2.5-VL-7B's vision tower (built by diffusers' side only; vLLM's text-only stage skips it).
VISION_CONFIG: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_chans": 3,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
}
# Qwen-Image's DiT (20B) and VAE.
DIT_CONFIG: dict[str, Any] = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": [16, 56, 56],
}
VAE_CONFIG: dict[str, Any] = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}
# shrink: the real path (build, dummy-loaded encoder, meta-built diffusers side) at toy widths,
# fp32, on the CPU: a check of the code, not a measurement.
SHRINK = {
    "text": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                           "mrope_section": [8, 12, 12]}},
    "vision": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 128,
               "fullatt_block_indexes": [1]},
    "dit": {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 32, "joint_attention_dim": 128,
            "axes_dims_rope": [8, 12, 12]},
    "vae": {"base_dim": 16},
}  # fmt: skip
BUILT_MARK = "BUILT-v1"  # written last: a dir without it is rebuilt


def image_shapes(shrink: bool = False) -> dict[str, dict[str, Any]]:
    """The configs the real path builds: the real ones, or `shrink`'s toy widths over them."""
    real = {"text": TEXT_CONFIG, "vision": VISION_CONFIG, "dit": DIT_CONFIG, "vae": VAE_CONFIG}
    return {k: {**v, **(SHRINK[k] if shrink else {})} for k, v in real.items()}


def real_dtype(shrink: bool = False) -> Any:
    """bf16 at the real sizes, fp32 shrunk (a CPU runs it)."""
    import torch

    return torch.float32 if shrink else torch.bfloat16


def tiny_dir() -> Path:
    """The tiny Qwen-Image checkpoint (built locally), whose tokenizer and scheduler the real dir takes."""
    from omni_mp.models.registry import resolve_model

    return Path(resolve_model("tiny-qwen-image"))


def build_on_device(cls: Any, config: dict[str, Any], device: str, dtype: Any) -> Any:
    """`cls(**config)` made right on `device` in `dtype` (no fp32 copy of 20B parameters
    anywhere), with the library's own random init."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(**config)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def text_encoder_config(tokenizer_dir: Path, sizes: dict[str, dict[str, Any]], dtype: str) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tid = tok.convert_tokens_to_ids
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "text_config": {**sizes["text"], "bos_token_id": tid("<|endoftext|>"), "eos_token_id": tid("<|im_end|>")},
        "vision_config": sizes["vision"],
        "image_token_id": tid("<|image_pad|>"),
        "video_token_id": tid("<|video_pad|>"),
        "vision_start_token_id": tid("<|vision_start|>"),
        "vision_end_token_id": tid("<|vision_end|>"),
        "torch_dtype": dtype,
    }


def build_qwen_image_dir(path: Path, shrink: bool = False) -> dict[str, Any]:
    """The real-size checkpoint dir: configs written here, the DiT's and the VAE's random bf16
    tensors, the tiny checkpoint's tokenizer and scheduler config, no text-encoder tensors."""
    import torch
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    if (path / BUILT_MARK).is_file():
        return {"skipped": f"{path} is built"}
    t0 = time.perf_counter()
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    tiny = tiny_dir()
    for part in ("tokenizer", "scheduler"):
        shutil.copytree(tiny / part, path / part)
    shutil.copy(tiny / "model_index.json", path / "model_index.json")
    sizes, dtype = image_shapes(shrink), real_dtype(shrink)
    text = text_encoder_config(path / "tokenizer", sizes, str(dtype).removeprefix("torch."))
    (path / "text_encoder").mkdir()
    (path / "text_encoder" / "config.json").write_text(json.dumps(text, indent=1))
    (path / "config.json").write_text(json.dumps(text, indent=1))  # the dir reads as the text model's
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):  # vLLM reads them here
        if (path / "tokenizer" / name).is_file():
            shutil.copy(path / "tokenizer" / name, path / name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dit = build_on_device(QwenImageTransformer2DModel, sizes["dit"], device, dtype)
    n_dit = sum(p.numel() for p in dit.parameters())
    dit.save_pretrained(path / "transformer", safe_serialization=True, max_shard_size="10GB")
    del dit
    vae = build_on_device(AutoencoderKLQwenImage, sizes["vae"], device, dtype)
    vae.save_pretrained(path / "vae", safe_serialization=True)
    del vae
    (path / BUILT_MARK).write_text("ok\n")
    return {"build_s": time.perf_counter() - t0, "dit_params": n_dit}

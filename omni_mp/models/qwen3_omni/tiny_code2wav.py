"""A tiny code2wav checkpoint whose audio is worth comparing ("tiny-qwen3-omni-code2wav").

transformers' default init leaves code2wav nearly silent (random codes give samples of rms
~3e-7), so an oracle test on it would pass whatever the streaming did: the weights here are
`code2wav_weights.init_code2wav`'s (rms `TARGET_RMS`; tiny-qwen3-omni's code2wav has the same).

`write_released_code2wav` writes the same kind of dir at the released code2wav sizes (about
0.2B parameters; sizes written here, `RELEASED_CODE2WAV`) for benchmarks.

The checkpoint dir holds the tiny Qwen3-Omni `config.json` (tiny-qwen3-omni's, whose
code2wav section is the one used) and only `code2wav.*` weights: a code2wav stage reads
nothing else. Built on first use, cached (omni_mp.models.cache).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec

from omni_mp.models.cache import build_cached
from omni_mp.models.qwen3_omni.code2wav_weights import TARGET_RMS, init_code2wav

# Qwen3-Omni-30B-A3B-Instruct's code2wav_config, every size explicit.
RELEASED_CODE2WAV = {
    "codebook_size": 2048,
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 3072,
    "sliding_window": 72,
    "max_position_embeddings": 8000,
    "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 1536,
    "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


class Code2WavTinySpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    base: str = "tiny-qwen3-omni"  # the tiny Qwen3-Omni (omni_mp.models.qwen3_omni.tiny) whose config.json is used
    seed: int = 0
    rms: float = TARGET_RMS


def _write_weights(out_dir: Path, seed: int, rms: float, device: str = "cpu") -> None:
    """`code2wav.*` weights for the code2wav section of out_dir/config.json."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    config = AutoConfig.from_pretrained(out_dir).code2wav_config
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3OmniMoeCode2Wav._from_config(config, dtype=torch.float32).eval()
    init_code2wav(model, seed, rms)
    state = {f"code2wav.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def _build(spec: Code2WavTinySpec, out_dir: Path) -> None:
    from omni_mp.models.qwen3_omni.tiny import build_named as build_base

    shutil.copy(build_base(spec.base) / "config.json", out_dir / "config.json")
    _write_weights(out_dir, spec.seed, spec.rms)


def write_released_code2wav(out_dir: Path, *, seed: int = 0, device: str = "cpu") -> Path:
    """A dir with the released Qwen3-Omni config (code2wav at `RELEASED_CODE2WAV`) and random
    `code2wav.*` weights (init_code2wav), fp32 (about 0.8 GB); reused when present."""
    from omni_mp.models.qwen3_omni.tiny import released_config

    if (out_dir / "model.safetensors").exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    config = released_config()
    for key, value in RELEASED_CODE2WAV.items():
        setattr(config.code2wav_config, key, value)
    config.save_pretrained(out_dir)
    _write_weights(out_dir, seed, TARGET_RMS, device)
    return out_dir


TINY_CODE2WAV_SPECS: dict[str, Code2WavTinySpec] = {"tiny-qwen3-omni-code2wav": Code2WavTinySpec()}


def build_named(name: str) -> Path:
    spec = TINY_CODE2WAV_SPECS[name]
    return build_cached("qwen3_omni-code2wav", spec, lambda out: _build(spec, out))

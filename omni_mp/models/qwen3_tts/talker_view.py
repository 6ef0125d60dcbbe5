"""A view of a Qwen3-TTS checkpoint that vLLM loads as our talker model
(omni_mp.models.qwen3_tts.vllm_hooks_talker): the checkpoint's weight files linked, and a config
of the talker's own: a Qwen3 dense decoder config (model_type `qwen3`, which transformers reads)
over the codec vocabulary, its M-RoPE (`rope_scaling`'s sections, with the text-only positions
the talker uses it is plain RoPE) as `rope_parameters`, and the code predictor's config.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from omni_mp.models.checkpoint_view import cached_view, link_files, weight_files

TALKER_ARCH = "OmniMpQwen3TtsTalker"  # the name register_talker() gives our vLLM model class
VIEW_VERSION = 1
_DECODER_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "attention_bias", "num_code_groups", "codec_eos_token_id", "codec_pad_id", "codec_bos_id",
)  # fmt: skip


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000.0))}
    scaling = cfg.get("rope_scaling") or {}
    if "mrope_section" in scaling:
        rope["mrope_section"] = list(scaling["mrope_section"])
        rope["mrope_interleaved"] = bool(scaling.get("interleaved", False))
    return rope


def talker_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The view's config from a Qwen3-TTS config.json (a dict)."""
    talker = config.get("talker_config")
    if not isinstance(talker, dict) or "code_predictor_config" not in talker:
        raise ValueError("config has no talker_config with a code_predictor_config (not Qwen3-TTS)")
    cfg = {k: talker[k] for k in _DECODER_FIELDS if k in talker}
    cfg.update(
        model_type="qwen3", architectures=[TALKER_ARCH], tie_word_embeddings=False, rope_parameters=_rope(talker)
    )
    cp = dict(talker["code_predictor_config"])
    cp["rope_parameters"] = _rope(cp)
    cfg["code_predictor_config"] = cp
    dtype = config.get("dtype") or config.get("torch_dtype")
    if dtype is not None:
        cfg["dtype"] = dtype  # vLLM's dtype "auto" reads it
    return cfg


def _write_view(checkpoint: Path, files: list[Path], out: Path) -> None:
    link_files(files, out)
    config = json.loads((checkpoint / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(talker_config_dict(config), indent=2, sort_keys=True))


def talker_view_dir(checkpoint_dir: str | Path, *, require_weights: bool = True) -> Path:
    """The view directory for `checkpoint_dir`, written once and reused."""
    checkpoint = Path(checkpoint_dir).resolve()
    files = weight_files(checkpoint, require=require_weights)
    write = functools.partial(_write_view, checkpoint, files)
    return cached_view("qwen3-tts-talker", checkpoint, [checkpoint / "config.json", *files], VIEW_VERSION, write)

"""A view of a Qwen3-TTS checkpoint that vLLM loads as our talker model
(omni_mp.models.qwen3_tts.vllm_hooks_talker): the checkpoint's weight files linked, and a config
of the talker's own: a Qwen3 dense decoder config (model_type `qwen3`, which transformers reads)
over the codec vocabulary, its M-RoPE (`rope_scaling`'s sections, with the text-only positions
the talker uses it is plain RoPE) as `rope_parameters`, and the code predictor's config with
its sampling settings (`subtalker`: the checkpoint's generation_config.json `subtalker_*` keys
over the reference's defaults, as qwen-tts's generate wrappers merge them).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import msgspec

from omni_mp.models.checkpoint_view import cached_view, link_files, weight_files

TALKER_ARCH = "OmniMpQwen3TtsTalker"  # the name register_talker() gives our vLLM model class
VIEW_VERSION = 2  # 2: the code predictor's sampling settings
GENERATION_CONFIG = "generation_config.json"
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


class SubtalkerSampling(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The code predictor's ("subtalker's") sampling, generation_config.json's keys; defaults:
    qwen-tts 0.1.1 generate()'s (Qwen3-Omni's differ: top-p 0.8, temperature 1)."""

    subtalker_dosample: bool = True
    subtalker_top_k: int = 50  # 0: no top-k (transformers' meaning)
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9


def subtalker_sampling(generation: dict[str, Any]) -> SubtalkerSampling:
    """The `subtalker_*` keys of a generation_config.json (a dict) over the defaults; a bad value
    is a ValueError naming its key."""
    keys = SubtalkerSampling.__struct_fields__
    try:
        s = msgspec.convert({k: generation[k] for k in keys if k in generation}, SubtalkerSampling)
    except msgspec.ValidationError as e:
        raise ValueError(f"{GENERATION_CONFIG}: {e}") from None
    if s.subtalker_top_k < 0:
        raise ValueError(f"{GENERATION_CONFIG}: subtalker_top_k must be >= 0, not {s.subtalker_top_k}")
    if not 0.0 < s.subtalker_top_p <= 1.0:
        raise ValueError(f"{GENERATION_CONFIG}: subtalker_top_p must be in (0, 1], not {s.subtalker_top_p}")
    if s.subtalker_dosample and s.subtalker_temperature <= 0.0:
        raise ValueError(f"{GENERATION_CONFIG}: subtalker_temperature must be > 0, not {s.subtalker_temperature}")
    return s


def talker_config_dict(config: dict[str, Any], generation: dict[str, Any] | None = None) -> dict[str, Any]:
    """The view's config from a Qwen3-TTS config.json and generation_config.json (dicts)."""
    talker = config.get("talker_config")
    if not isinstance(talker, dict) or "code_predictor_config" not in talker:
        raise ValueError("config has no talker_config with a code_predictor_config (not Qwen3-TTS)")
    cfg = {k: talker[k] for k in _DECODER_FIELDS if k in talker}
    cfg.update(
        model_type="qwen3", architectures=[TALKER_ARCH], tie_word_embeddings=False, rope_parameters=_rope(talker)
    )
    cp = dict(talker["code_predictor_config"])
    cp["rope_parameters"] = _rope(cp)
    cp["subtalker"] = msgspec.to_builtins(subtalker_sampling(generation or {}))
    cfg["code_predictor_config"] = cp
    dtype = config.get("dtype") or config.get("torch_dtype")
    if dtype is not None:
        cfg["dtype"] = dtype  # vLLM's dtype "auto" reads it
    return cfg


def _write_view(checkpoint: Path, files: list[Path], out: Path) -> None:
    link_files(files, out)
    config = json.loads((checkpoint / "config.json").read_text())
    gen_path = checkpoint / GENERATION_CONFIG
    generation = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    view = talker_config_dict(config, generation)
    (out / "config.json").write_text(json.dumps(view, indent=2, sort_keys=True))


def talker_view_dir(checkpoint_dir: str | Path, *, require_weights: bool = True) -> Path:
    """The view directory for `checkpoint_dir`, written once and reused (rewritten when its
    config.json, generation_config.json or weight files change)."""
    checkpoint = Path(checkpoint_dir).resolve()
    files = weight_files(checkpoint, require=require_weights)
    sources = [checkpoint / "config.json", *[p for p in [checkpoint / GENERATION_CONFIG] if p.is_file()], *files]
    write = functools.partial(_write_view, checkpoint, files)
    return cached_view("qwen3-tts-talker", checkpoint, sources, VIEW_VERSION, write)

"""A "talker view" of a full Qwen3-Omni checkpoint: a directory that vLLM loads as the talker alone.

vLLM 0.25.0 has no Qwen3-Omni talker, and a full checkpoint resolves to its thinker. The view's
`config.json` is the checkpoint's talker text config (model_type `qwen3_omni_moe_talker_text`,
which transformers' AutoConfig knows, so vLLM reads the MoE decoder's sizes from it) plus
what the rest of the talker needs: `code_predictor_config` (a dict), `num_code_groups`,
`thinker_hidden_size`, the codec special ids, and `architectures` naming our vLLM model class
(omni_mp.models.qwen3_omni.vllm_hooks_talker, registered by `register_talker()`). The weight
files are symlinks to the checkpoint's own (the model loads only `talker.*` keys).

Views are cached by omni_mp.models.checkpoint_view. No vLLM import here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from omni_mp.models.checkpoint_view import cached_view, link_files, weight_files

TALKER_ARCH = "OmniMpQwen3OmniTalker"  # the name register_talker() gives our vLLM model class
VIEW_VERSION = 1  # bump when the view's contents change
# Talker config fields the view carries beside the text config.
_TALKER_FIELDS = (
    "num_code_groups",
    "thinker_hidden_size",
    "codec_eos_token_id",
    "codec_pad_id",
    "codec_bos_id",
    "codec_nothink_id",
    "codec_think_bos_id",
    "codec_think_eos_id",
    "accept_hidden_layer",
)


def talker_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The view's config from a Qwen3-Omni config.json (a dict)."""
    talker = config.get("talker_config")
    if not isinstance(talker, dict) or "text_config" not in talker or "code_predictor_config" not in talker:
        raise ValueError("config has no talker_config with text_config and code_predictor_config (not Qwen3-Omni)")
    cfg = dict(talker["text_config"])
    cfg["model_type"] = "qwen3_omni_moe_talker_text"
    cfg["architectures"] = [TALKER_ARCH]
    cfg["code_predictor_config"] = dict(talker["code_predictor_config"])
    for key in _TALKER_FIELDS:
        if key in talker:
            cfg[key] = talker[key]
    dtype = config.get("dtype") or config.get("torch_dtype")
    if cfg.get("dtype") is None and dtype is not None:
        cfg["dtype"] = dtype  # vLLM's dtype "auto" reads it
    return cfg


def _write_view(checkpoint: Path, files: list[Path], out: Path) -> None:
    link_files(files, out)
    config = json.loads((checkpoint / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(talker_config_dict(config), indent=2, sort_keys=True))


def talker_view_dir(checkpoint_dir: str | Path, *, require_weights: bool = True) -> Path:
    """The view directory for `checkpoint_dir`, written once (file lock, atomic rename) and
    reused. `require_weights=False` (vLLM's `load_format: dummy`): no weight links needed."""
    checkpoint = Path(checkpoint_dir).resolve()
    files = weight_files(checkpoint, require=require_weights)
    write = functools.partial(_write_view, checkpoint, files)
    return cached_view("qwen3-talker", checkpoint, [checkpoint / "config.json", *files], VIEW_VERSION, write)

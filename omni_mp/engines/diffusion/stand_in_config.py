"""A config vLLM can read for a diffusion stage whose checkpoint's `config.json` names a model
type transformers does not know (Qwen3-TTS: `qwen3_tts`, served by the qwen-tts package).

vLLM's ModelConfig reads a checkpoint's config with transformers even though a diffusion stage's
worker builds its own model (the engine already tells vLLM the architecture is a plain causal LM);
for such a checkpoint it gets a tiny Qwen2 config instead (`hf_config_path`), written once into
omni_mp's cache. Checkpoints transformers can read keep their own config.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from omni_mp.models.cache import build_cached

STAND_IN = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 256,
    "max_position_embeddings": 1 << 20,  # a stage's max_model_len is its own (engine_args)
}


class _StandIn(msgspec.Struct, frozen=True):
    version: int = 1


def stand_in_config_path(model_dir: str) -> str | None:
    """The stand-in config dir when transformers cannot read `model_dir`'s config.json, else None."""
    from transformers import CONFIG_MAPPING

    path = Path(model_dir) / "config.json"
    if not path.exists():
        return None
    model_type = json.loads(path.read_text()).get("model_type")
    if model_type is None or model_type in CONFIG_MAPPING:
        return None
    out = build_cached(
        "diffusion-config-stand-in",
        _StandIn(),
        lambda d: (d / "config.json").write_text(json.dumps(STAND_IN)),
        verbose=False,
    )
    return str(out)

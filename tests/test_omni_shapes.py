"""The Qwen2.5-Omni 7B-shape checkpoint writer (omni_mp.models.qwen2_5_omni.shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omni_mp.models.qwen2_5_omni.shapes import (
    MROPE_SECTION,
    RELEASED_TALKER,
    OmniShapesSpec,
    omni_shapes_config,
    write_omni_shapes,
)


def test_7b_shapes_default_talker_option_is_transformers_defaults_with_mrope() -> None:
    from transformers import Qwen2_5OmniConfig

    cfg, default = omni_shapes_config(OmniShapesSpec(talker="default")), Qwen2_5OmniConfig()
    text, talker = cfg.thinker_config.text_config, cfg.talker_config
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        assert getattr(text, name) == getattr(default.thinker_config.text_config, name), name
        assert getattr(talker, name) == getattr(default.talker_config, name), name
    assert text.rope_parameters["mrope_section"] == talker.rope_parameters["mrope_section"] == MROPE_SECTION
    assert sum(MROPE_SECTION) * 2 == text.hidden_size // text.num_attention_heads == talker.head_dim
    assert talker.embedding_size == text.hidden_size and not text.tie_word_embeddings


def test_7b_shapes_have_the_released_talker_by_default() -> None:
    """The released Qwen2.5-Omni-7B talker (its checkpoint's config): narrower than its heads."""
    from transformers import Qwen2_5OmniConfig

    cfg, default = omni_shapes_config(), Qwen2_5OmniConfig()
    talker, text = cfg.talker_config, cfg.thinker_config.text_config
    got = {k: getattr(talker, k) for k in RELEASED_TALKER}
    assert got == {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 18944,
        "vocab_size": 8448,
        "embedding_size": 3584,
    }
    assert talker.embedding_size == text.hidden_size == default.thinker_config.text_config.hidden_size
    assert talker.rope_parameters["mrope_section"] == MROPE_SECTION
    assert text.num_hidden_layers == default.thinker_config.text_config.num_hidden_layers


def test_scaled_dir_keeps_the_architecture(tmp_path: Path) -> None:
    out = write_omni_shapes(tmp_path / "m", OmniShapesSpec(scale=28))
    doc = json.loads((out / "config.json").read_text())
    text, talker = doc["thinker_config"]["text_config"], doc["talker_config"]
    assert doc["architectures"] == ["Qwen2_5OmniModel"] and text["vocab_size"] == 152064
    assert text["hidden_size"] == 128 and text["num_hidden_layers"] == 2
    assert text["rope_parameters"]["mrope_section"] == talker["rope_parameters"]["mrope_section"] == MROPE_SECTION
    assert talker["embedding_size"] == text["hidden_size"] and talker["head_dim"] == 128
    assert talker["hidden_size"] < talker["num_attention_heads"] * 128  # the released talker's narrow width
    spk = torch.load(out / "spk_dict.pt", weights_only=True)
    dit = doc["token2wav_config"]["dit_config"]
    for entry in spk.values():
        assert entry["bos_token"] < text["vocab_size"]
        assert entry["cond"].shape == (1, dit["enc_emb_dim"]) and entry["ref_mel"].shape[2] == dit["mel_dim"]
    assert dit["num_embeds"] == 8193  # every real codec id stays valid
    assert not (out / "tokenizer_config.json").exists()
    assert (out / "model.safetensors").exists() and (out / "generation_config.json").exists()

"""GPU memory budgets of Qwen3-TTS stages (omni_mp.models.qwen3_tts.sizing): the shipped
omni_mp/stage_configs/qwen3_tts.yaml planned on the tiny checkpoint and at the released sizes,
against parameter counts read independently of the planner (the safetensors library; by hand)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from safetensors import safe_open

from omni_mp.config.schema import PipelineConfig
from omni_mp.config.validate import load_config
from omni_mp.control.memory_budget import GiB, MemoryBudgetError, apply_memory_plan, estimate_needs, plan_memory
from omni_mp.models.registry import builtin_model
from omni_mp.stage_configs import CONFIG_DIR
from tests.test_memory_budget import H200

TALKER_KV_TOKENS = 64 * 4096  # the shipped talker: max_num_seqs x max_model_len
CONVS = ("upsample", "decoder")  # transformers' Qwen3-Omni code2wav modules that are the decoder's convolutions


def _shipped(model_dir: Path) -> PipelineConfig:
    cfg = load_config(CONFIG_DIR / "qwen3_tts.yaml")
    return msgspec.structs.replace(cfg, stages=[msgspec.structs.replace(s, model=str(model_dir)) for s in cfg.stages])


def _numel(path: Path, keep: Any) -> int:
    """Elements of the tensors of a safetensors file whose name `keep` accepts (the library's reader)."""
    with safe_open(str(path), framework="pt") as fh:
        return sum(_prod(fh.get_slice(k).get_shape()) for k in fh.keys() if keep(k))


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_shipped_budgets_on_the_tiny_checkpoint() -> None:
    """The talker stage holds `talker.*` less the text embedding and projection (the entry
    stage's prompt format keeps them on the CPU) in bf16, the decoder stage `decoder.*` of
    speech_tokenizer/model.safetensors in fp32, counted here with the safetensors library; the
    talker's one-request KV cache is max_model_len x 2 (K, V) x layers x KV heads x head_dim x 2
    bytes of its talker_config. The decoder built on the CPU holds no more than the planner's
    weights and activations together (its transformers module's unused code embedding
    included), and no less than its weights less that embedding. The plan fits one H200."""
    model_dir = builtin_model("tiny-qwen3-tts-custom-voice")
    entry = ("talker.model.text_embedding.", "talker.text_projection.")
    talker = _numel(model_dir / "model.safetensors", lambda k: k.startswith("talker.") and not k.startswith(entry))
    decoder = _numel(model_dir / "speech_tokenizer" / "model.safetensors", lambda k: k.startswith("decoder."))
    cfg = _shipped(model_dir)
    needs = [estimate_needs(s, model_dir) for s in cfg.stages]
    assert needs[0].weight_bytes == 2 * talker and needs[1].weight_bytes == 4 * decoder
    t = json.loads((model_dir / "config.json").read_text())["talker_config"]
    per_token = 2 * t["num_hidden_layers"] * t["num_key_value_heads"] * t["head_dim"] * 2
    assert needs[0].min_kv_bytes == 4096 * per_token and needs[1].min_kv_bytes == 0

    from omni_mp.models.qwen3_tts.codec_decoder import TtsCodecDecoder

    built = TtsCodecDecoder.from_checkpoint(model_dir, torch.device("cpu"))
    tensors = {t.data_ptr(): t for m in (built.hf, built.front) for t in [*m.parameters(), *m.buffers()]}
    held = sum(t.numel() * t.element_size() for t in tensors.values())
    unused = built.hf.code_embedding.weight
    assert held - unused.numel() * 4 <= needs[1].weight_bytes
    assert held <= needs[1].weight_bytes + needs[1].activation_bytes

    plan = plan_memory(cfg, H200)
    assert [p.stage_id for p in plan.stages] == [0, 1]
    args = apply_memory_plan(cfg, plan).stages[0].engine_args
    assert args["kv_cache_memory_bytes"] >= TALKER_KV_TOKENS * per_token


def _header_only(path: Path, shapes: Iterable[tuple[str, tuple[int, ...]]], dtype: str, width: int) -> None:
    """A safetensors file's header with no data after it: all the planner reads."""
    header, offset = {}, 0
    for name, shape in shapes:
        size = width * _prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


@pytest.fixture(scope="module")
def released_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-TTS-12Hz-1.7B-CustomVoice's configs (released_config) and its safetensors headers,
    with the tensor names and shapes the released-size benchmark checkpoint writes (not its 4 GB)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omni_mp.models.qwen3_tts.codec_decoder import omni_code2wav_config
    from omni_mp.models.qwen3_tts.released_config import (
        released_decoder_config,
        released_speech_tokenizer_config,
        released_top_config,
    )
    from omni_mp.models.qwen3_tts.tiny import _decoder_front_shapes, _talker_shapes

    out = tmp_path_factory.mktemp("qwen3_tts_released")
    (out / "speech_tokenizer").mkdir()
    top, d = released_top_config(), released_decoder_config()
    (out / "config.json").write_text(json.dumps(top))
    (out / "speech_tokenizer" / "config.json").write_text(json.dumps(released_speech_tokenizer_config()))
    _header_only(out / "model.safetensors", _talker_shapes(top["talker_config"]), "BF16", 2)
    with torch.device("meta"):
        convs = Qwen3OmniMoeCode2Wav(omni_code2wav_config(d, d["latent_dim"])).state_dict()
    conv_shapes = [(f"decoder.{k}", tuple(v.shape)) for k, v in convs.items() if k.split(".")[0] in CONVS]
    _header_only(out / "speech_tokenizer" / "model.safetensors", [*conv_shapes, *_decoder_front_shapes(d)], "F32", 4)
    return out


def _qwen3_layer(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """q, k, v, o; q/k norms; gate, up, down; two layer norms."""
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return attn + 2 * head_dim + 3 * hidden * inter + 2 * hidden


def test_shipped_budgets_fit_one_h200_at_the_released_sizes(released_dir: Path) -> None:
    """By hand, from released_config: the talker's 28 layers (2048 wide, MLP 6144, 16 / 8 heads
    of 128) + norm + codec embedding and head (3072 x 2048 each); its code predictor's 5 layers
    (1024 wide, MLP 3072, 16 / 8 heads of 128) + norm, 15 codec embeddings (2048 x 2048) and
    heads (2048 x 1024), small_to_mtp_projection 2048 -> 1024: 1,597,118,720 parameters, 2.97 GiB
    of bf16. The decoder's front: split RVQ (in / out projections 512 <-> 256, 16 codebooks of
    2048 x 256 with usage), pre_conv 512 -> 1024 (kernel 3), 8 transformer layers (1024 wide,
    MLP 3072, 16 heads of 64, 2 layer scales, no q/k norms) + norm + in / out projections
    1024 x 1024 with biases: 121,704,448; its convolutions are transformers' Qwen3-Omni code2wav
    modules at latent_dim (counted by torch). Its activations cover the convolutions measured
    on a CPU (64 windows of 12 frames: under 3 GB) at the 26 frames of a chunk's context window.
    The talker's KV cache holds 64 sequences x 4096 tokens x (28 layers x 8 heads x 128 x 2 x
    2 bytes = 112 KiB) = 28 GiB, and both budgets fit one H200's 139 GiB free."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omni_mp.models.qwen3_tts.codec_decoder import omni_code2wav_config
    from omni_mp.models.qwen3_tts.released_config import released_decoder_config

    talker = 28 * _qwen3_layer(2048, 6144, 16, 8, 128) + 2048 + 2 * 3072 * 2048
    predictor = 5 * _qwen3_layer(1024, 3072, 16, 8, 128) + 1024 + 15 * (2048 * 2048 + 2048 * 1024)
    predictor += 1024 * 2048 + 1024
    assert talker + predictor == 1_597_118_720
    layer = 4 * 1024 * 1024 + 3 * 1024 * 3072 + 4 * 1024
    rvq = 4 * 512 * 256 + 16 * (2048 + 2048 * 256)
    front = rvq + 1024 * 512 * 3 + 1024 + 8 * layer + 1024 + 2 * (1024 * 1024 + 1024)
    assert front == 121_704_448
    d = released_decoder_config()
    with torch.device("meta"):
        hf = Qwen3OmniMoeCode2Wav(omni_code2wav_config(d, d["latent_dim"]))
    convs = sum(p.numel() for n, p in hf.named_parameters() if n.split(".")[0] in CONVS)

    cfg = _shipped(released_dir)
    plan = plan_memory(cfg, H200)
    stages = {p.stage_id: p for p in plan.stages}
    assert stages[0].needs.weight_bytes == 2 * (talker + predictor)
    assert stages[1].needs.weight_bytes == 4 * (front + convs)
    assert stages[1].needs.activation_bytes >= 3e9 * 26 / 12
    assert stages[0].kv_cache_bytes is not None and stages[0].kv_cache_bytes >= TALKER_KV_TOKENS * 112 * 1024
    assert sum(p.budget_bytes for p in plan.stages) <= 139 * GiB

    # A talker budget 3 GiB smaller leaves its KV cache short of all 64 sequences at max_model_len.
    small = msgspec.structs.replace(cfg.stages[0].memory, gpu_gib=cfg.stages[0].memory.gpu_gib - 3)
    cut = msgspec.structs.replace(cfg, stages=[msgspec.structs.replace(cfg.stages[0], memory=small), cfg.stages[1]])
    assert plan_memory(cut, H200).stages[0].kv_cache_bytes < TALKER_KV_TOKENS * 112 * 1024  # type: ignore[operator]


def test_dummy_weights_cannot_be_sized() -> None:
    """No transformers class builds Qwen3-TTS: a budgeted stage with `load_format: dummy` is
    refused before anything starts, naming the stage, the part and why."""
    model_dir = builtin_model("tiny-qwen3-tts-custom-voice")
    cfg = _shipped(model_dir)
    for s in cfg.stages:
        dummy = msgspec.structs.replace(s, engine_args={**s.engine_args, "load_format": "dummy"})
        part = "talker" if s.kind == "ar" else "decoder"
        with pytest.raises(MemoryBudgetError, match=rf"stage {s.id}: cannot size '{part}' of model_type 'qwen3_tts' "
                           r"without its safetensors \(load_format: dummy"):  # fmt: skip
            estimate_needs(dummy, model_dir)

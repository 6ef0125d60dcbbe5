"""A Qwen2.5-Omni checkpoint dir at the released 7B sizes (random weights), for benchmarks at real
size: no hub download, nothing of the real model.

What the dir holds:
- `config.json`: transformers' default `Qwen2_5OmniConfig` (7B thinker and token2wav) with the
  released 7B talker (`talker="released"`, the default: hidden 896, 24 layers, 12 attention
  heads, 4 KV heads, head_dim 128, intermediate 18944, vocab 8448, embedding 3584; transformers'
  default talker is thinker-sized: `talker="default"` keeps it), with the thinker's and the talker's
  `rope_parameters` carrying `mrope_section` [16, 24, 24] like the released checkpoint (the
  defaults have none, and vLLM's M-RoPE needs it), untied thinker embeddings (Qwen2-7B's), and
  the thinker EOS set (so its generation_config has one). Thinker and talker weights come from
  vLLM's `load_format: dummy` (or transformers' random init for the baseline).
- `model.safetensors` with the `token2wav.*` tensors only (random, fp32): the diffusion stage
  loads real tensors; vLLM with `load_format: dummy` never reads the file.
- `spk_dict.pt`: random speakers {name: {bos_token, cond [1, enc_emb_dim], ref_mel [1, T, mel_dim]}}.
- `generation_config.json`.
No tokenizer or processor files: vLLM starts the thinker with `skip_tokenizer_init: true` and
`limit_mm_per_prompt` 0 for image/video/audio (`thinker_engine_args`), which also skips
building the audio and vision towers. Prompts go in as token ids.

`scale` > 1 keeps the architecture (head_dim 128, M-RoPE sections, vocab and special ids) and
shrinks the decoders (heads and layers divided by `scale`), with toy audio/vision encoders and
token2wav: a variant of the same writer that a CPU can run end to end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import msgspec

from omni_mp.models.cache import build_cached

MROPE_SECTION = [16, 24, 24]  # the released checkpoint's; sum = head_dim / 2 with head_dim 128
HEAD_DIM = 128
# Speaker bos tokens: thinker-vocab ids past the tts_text_* ids (151859..151861), below 152064.
SPEAKERS = (("Chelsie", 151870), ("Ethan", 151871))
REF_MEL_FRAMES = 300  # reference mel length of each random speaker
THINKER_EOS = 151645  # <|im_end|>


# The released Qwen2.5-Omni-7B checkpoint's talker (its config.json); transformers' default
# talker config is thinker-sized (hidden 3584, 28 layers, 28 heads).
RELEASED_TALKER = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": HEAD_DIM,
    "intermediate_size": 18944,
    "vocab_size": 8448,
    "embedding_size": 3584,
}


class OmniShapesSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    scale: int = 1  # 1: full sizes; > 1: heads and layers divided by it
    talker: Literal["released", "default"] = "released"  # released 7B talker or transformers' default
    seed: int = 0
    token2wav_weights: bool = True  # write model.safetensors with random token2wav.* tensors
    layout: int = 2  # bumped when what is written changes: the cache key is the spec


SHAPES_7B = OmniShapesSpec()


def _scaled_decoder(d: dict[str, Any], scale: int) -> dict[str, Any]:
    """Heads (and so width) and layers divided by `scale`; head_dim kept at 128, so the M-RoPE
    sections and the attention kernels are those of the full model."""
    if scale == 1:
        return {}
    heads = max(1, d["num_attention_heads"] // scale)
    kv = max(1, d["num_key_value_heads"] // scale)
    while heads % kv:
        kv -= 1
    inter = max(128, d["intermediate_size"] // scale // 64 * 64)
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_size": heads * HEAD_DIM,
        "intermediate_size": inter,
        "num_hidden_layers": max(2, d["num_hidden_layers"] // scale),
    }


def _scaled_talker(d: dict[str, Any], spec: OmniShapesSpec) -> dict[str, Any]:
    """The talker scaled like the thinker; the released talker keeps its narrow width
    (heads * head_dim > hidden, as in the checkpoint)."""
    out = _scaled_decoder(d, spec.scale)
    if spec.talker == "released":
        out["hidden_size"] = max(64, d["hidden_size"] // spec.scale // 32 * 32)
    return out


def omni_shapes_config(spec: OmniShapesSpec = SHAPES_7B) -> Any:
    """The `Qwen2_5OmniConfig` of `spec` (transformers' defaults at scale 1)."""
    from transformers import Qwen2_5OmniConfig

    if spec.scale < 1:
        raise ValueError(f"scale must be >= 1, got {spec.scale}")
    default = Qwen2_5OmniConfig()
    text_d = default.thinker_config.text_config.to_dict()
    talker_d = default.talker_config.to_dict()
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": list(MROPE_SECTION)}
    text = {"rope_parameters": rope, "tie_word_embeddings": False, "eos_token_id": THINKER_EOS}
    text.update(_scaled_decoder(text_d, spec.scale))
    width = text.get("hidden_size", text_d["hidden_size"])
    # The released thinker config names its vision start/end ids (get_rope_index reads them);
    # transformers' default thinker config lacks them.
    thinker: dict[str, Any] = {"text_config": text, "vision_start_token_id": 151652, "vision_end_token_id": 151653}
    talker: dict[str, Any] = {"rope_parameters": rope, "head_dim": HEAD_DIM, "embedding_size": width}
    if spec.talker == "released":
        talker_d = {**talker_d, **RELEASED_TALKER}
        talker.update({k: v for k, v in RELEASED_TALKER.items() if k != "embedding_size"})
    talker.update(_scaled_talker(talker_d, spec) if spec.scale > 1 else {})
    token2wav: dict[str, Any] = {}
    if spec.scale > 1:
        # Toy encoders (text-only prompts never reach them) and token2wav; the codec vocab keeps
        # its 8193 DiT embeddings so every real codec id stays valid.
        from omni_mp.models.qwen2_5_omni.tiny import Token2WavSpec, omni_config

        tiny = omni_config(Token2WavSpec(num_embeds=default.token2wav_config.dit_config.num_embeds))
        thinker["audio_config"] = {**tiny.thinker_config.audio_config.to_dict(), "output_dim": width}
        thinker["vision_config"] = {**tiny.thinker_config.vision_config.to_dict(), "out_hidden_size": width}
        token2wav = tiny.token2wav_config.to_dict()
    return Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, token2wav_config=token2wav, enable_audio_output=True
    )


def write_omni_shapes(out_dir: Path, spec: OmniShapesSpec = SHAPES_7B) -> Path:
    """Write the config-only checkpoint dir of `spec` into `out_dir` (see the module doc)."""
    import torch
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    config = omni_shapes_config(spec)
    config.architectures = ["Qwen2_5OmniModel"]  # the released checkpoint's; vLLM maps it to the thinker
    config.save_pretrained(out_dir)
    # save_pretrained drops torch_dtype-like fields that equal defaults in some versions: be explicit.
    doc = json.loads((out_dir / "config.json").read_text())
    doc["torch_dtype"] = doc["dtype"] = "bfloat16"
    (out_dir / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    GenerationConfig(eos_token_id=THINKER_EOS, pad_token_id=151643).save_pretrained(out_dir)
    gen = torch.Generator().manual_seed(spec.seed)
    dit = config.token2wav_config.dit_config
    speakers = {
        name: {
            "bos_token": bos,
            "cond": torch.randn(1, dit.enc_emb_dim, generator=gen),
            "ref_mel": torch.randn(1, REF_MEL_FRAMES, dit.mel_dim, generator=gen) - 5.0,  # log-mel-like
        }
        for name, bos in SPEAKERS
    }
    torch.save(speakers, out_dir / "spk_dict.pt")
    if spec.token2wav_weights:
        _write_token2wav(out_dir, config, spec.seed)
    return out_dir


def _write_token2wav(out_dir: Path, config: Any, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    torch.manual_seed(seed)  # transformers' init draws from the global RNG
    t2w = Qwen2_5OmniToken2WavModel._from_config(config.token2wav_config, dtype=torch.float32).eval()
    state = {f"token2wav.{k}": v.contiguous() for k, v in t2w.state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def build_omni_shapes(spec: OmniShapesSpec = SHAPES_7B, cache_dir: Path | None = None) -> Path:
    """The dir of `spec`, written once and cached (omni_mp.models.cache)."""
    return build_cached("qwen2_5_omni-shapes", spec, lambda out: write_omni_shapes(out, spec), cache_dir=cache_dir)


def thinker_engine_args() -> dict[str, Any]:
    """What vLLM 0.25.0 needs to start the thinker from a dir without tokenizer/processor files."""
    return {
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        # 0 for every modality: vLLM builds no multimodal processor and skips the towers.
        "limit_mm_per_prompt": {"image": 0, "video": 0, "audio": 0},
    }

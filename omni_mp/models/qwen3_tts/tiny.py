"""Tiny Qwen3-TTS checkpoints in the reference's on-disk format (qwen-tts 0.1.1), built here with
random weights, nothing from a hub, without the reference package (its pins cannot share our
environment): config.json + model.safetensors + a local tokenizer keeping the released special
tokens (Qwen3-Omni's tiny tokenizer builder) + generation_config.json + speech_tokenizer/
(config.json, model.safetensors, preprocessor_config.json).

Weights are drawn by name and shape from the config (`_talker_shapes`, `_speaker_shapes`,
`_decoder_front_shapes`); the codec decoder's convolutional half has Qwen3-Omni code2wav's
module names and shapes, so transformers' `Qwen3OmniMoeCode2Wav` at the same sizes supplies them
and `init_code2wav` makes them audible; the Mimi encoder is transformers' `MimiModel`'s encoder
half. tests/test_qwen3_tts_oracle.py checks the reference loads every tensor and no other.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from omni_mp.models.cache import build_cached
from omni_mp.models.qwen3_tts.talker_view import SubtalkerSampling
from omni_mp.models.qwen3_tts.tiny_config import (
    TinyTtsSpec,
    decoder_config,
    encoder_config,
    speech_tokenizer_config,
    top_config,
)

# The released 1.7B's shape: a code predictor narrower than the talker, and sampling settings of
# its own in generation_config.json (none of them the reference's defaults or Qwen3-Omni's) over
# sharper logits (init std 0.3), so that a test of sampled codes tells which settings were applied.
NARROW_SUBTALKER = SubtalkerSampling(subtalker_top_k=12, subtalker_top_p=0.95, subtalker_temperature=0.5)
TINY_SPECS: dict[str, TinyTtsSpec] = {
    "tiny-qwen3-tts-custom-voice": TinyTtsSpec(variant="custom_voice"),
    "tiny-qwen3-tts-voice-design": TinyTtsSpec(variant="voice_design", seed=1),
    "tiny-qwen3-tts-base": TinyTtsSpec(variant="base", seed=2),
    "tiny-qwen3-tts-narrow-predictor": TinyTtsSpec(
        variant="custom_voice", seed=3, predictor_hidden=32, lm_init_std=0.3, subtalker=NARROW_SUBTALKER
    ),
}
TINY_BUILD = 2  # bump when the build changes without a spec change (2: Mimi codebooks drawn)

Shape = tuple[int, ...]


def _decoder_layer(
    prefix: str, hidden: int, inter: int, heads: int, kv: int, head_dim: int
) -> Iterator[tuple[str, Shape]]:
    """A Qwen3 decoder layer (q/k norms on the head dim), the talker's and code predictor's."""
    yield f"{prefix}.self_attn.q_proj.weight", (heads * head_dim, hidden)
    yield f"{prefix}.self_attn.k_proj.weight", (kv * head_dim, hidden)
    yield f"{prefix}.self_attn.v_proj.weight", (kv * head_dim, hidden)
    yield f"{prefix}.self_attn.o_proj.weight", (hidden, heads * head_dim)
    yield f"{prefix}.self_attn.q_norm.weight", (head_dim,)
    yield f"{prefix}.self_attn.k_norm.weight", (head_dim,)
    yield f"{prefix}.mlp.gate_proj.weight", (inter, hidden)
    yield f"{prefix}.mlp.up_proj.weight", (inter, hidden)
    yield f"{prefix}.mlp.down_proj.weight", (hidden, inter)
    yield f"{prefix}.input_layernorm.weight", (hidden,)
    yield f"{prefix}.post_attention_layernorm.weight", (hidden,)


def _layers(prefix: str, c: dict[str, Any]) -> Iterator[tuple[str, Shape]]:
    args = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"])
    for i in range(c["num_hidden_layers"]):
        yield from _decoder_layer(f"{prefix}.layers.{i}", *args)
    yield f"{prefix}.norm.weight", (c["hidden_size"],)


def _talker_shapes(t: dict[str, Any]) -> Iterator[tuple[str, Shape]]:
    h, th, cp = t["hidden_size"], t["text_hidden_size"], t["code_predictor_config"]
    yield from _layers("talker.model", t)
    yield "talker.model.codec_embedding.weight", (t["vocab_size"], h)
    yield "talker.model.text_embedding.weight", (t["text_vocab_size"], th)
    yield "talker.text_projection.linear_fc1.weight", (th, th)
    yield "talker.text_projection.linear_fc1.bias", (th,)
    yield "talker.text_projection.linear_fc2.weight", (h, th)
    yield "talker.text_projection.linear_fc2.bias", (h,)
    yield "talker.codec_head.weight", (t["vocab_size"], h)
    yield from _layers("talker.code_predictor.model", cp)
    for g in range(t["num_code_groups"] - 1):
        yield f"talker.code_predictor.model.codec_embedding.{g}.weight", (cp["vocab_size"], h)
        yield f"talker.code_predictor.lm_head.{g}.weight", (cp["vocab_size"], cp["hidden_size"])
    if cp["hidden_size"] != h:
        yield "talker.code_predictor.small_to_mtp_projection.weight", (cp["hidden_size"], h)
        yield "talker.code_predictor.small_to_mtp_projection.bias", (cp["hidden_size"],)


def _speaker_shapes(s: dict[str, Any]) -> Iterator[tuple[str, Shape]]:
    """The ECAPA-TDNN speaker encoder (Base checkpoints only)."""
    ch, ks, scale, se = s["enc_channels"], s["enc_kernel_sizes"], s["enc_res2net_scale"], s["enc_se_channels"]

    def conv(name: str, cout: int, cin: int, k: int) -> Iterator[tuple[str, Shape]]:
        yield f"speaker_encoder.{name}.weight", (cout, cin, k)
        yield f"speaker_encoder.{name}.bias", (cout,)

    yield from conv("blocks.0.conv", ch[0], s["mel_dim"], ks[0])
    for i in range(1, len(ch) - 1):
        b, c = f"blocks.{i}", ch[i]
        yield from conv(f"{b}.tdnn1.conv", c, ch[i - 1], 1)
        for j in range(scale - 1):
            yield from conv(f"{b}.res2net_block.blocks.{j}.conv", c // scale, c // scale, ks[i])
        yield from conv(f"{b}.tdnn2.conv", c, c, 1)
        yield from conv(f"{b}.se_block.conv1", se, c, 1)
        yield from conv(f"{b}.se_block.conv2", c, se, 1)
    yield from conv("mfa.conv", ch[-1], ch[-1], ks[-1])
    yield from conv("asp.tdnn.conv", s["enc_attention_channels"], 3 * ch[-1], 1)
    yield from conv("asp.conv", ch[-1], s["enc_attention_channels"], 1)
    yield from conv("fc", s["enc_dim"], 2 * ch[-1], 1)


def _draw(shapes: Iterator[tuple[str, Shape]], seed: int, std: float) -> dict[str, Any]:
    """Matrices ~ N(0, std) (embeddings too), norms 1, biases 0: seeded, in name order."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for name, shape in sorted(shapes):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        elif len(shape) == 1:
            out[name] = torch.zeros(shape)
        else:
            out[name] = torch.randn(shape, generator=gen) * std
    return out


def _decoder_front_shapes(d: dict[str, Any]) -> Iterator[tuple[str, Shape]]:
    """The decoder's parts before the convolutions: split RVQ codebooks, pre_conv, transformer."""
    cd, half, h, lat = d["codebook_dim"], d["codebook_dim"] // 2, d["hidden_size"], d["latent_dim"]
    for part, n in (("rvq_first", 1), ("rvq_rest", d["num_quantizers"] - 1)):
        q = f"decoder.quantizer.{part}"
        yield f"{q}.input_proj.weight", (half, cd, 1)
        yield f"{q}.output_proj.weight", (cd, half, 1)
        for i in range(n):
            yield f"{q}.vq.layers.{i}._codebook.cluster_usage", (d["codebook_size"],)
            yield f"{q}.vq.layers.{i}._codebook.embedding_sum", (d["codebook_size"], half)
    yield "decoder.pre_conv.conv.weight", (lat, cd, 3)
    yield "decoder.pre_conv.conv.bias", (lat,)
    p = "decoder.pre_transformer"
    for i in range(d["num_hidden_layers"]):
        lay = f"{p}.layers.{i}"
        yield from (
            (k, s)
            for k, s in _decoder_layer(
                lay, h, d["intermediate_size"], d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]
            )
            if "_norm." not in k
        )
        yield f"{lay}.self_attn_layer_scale.scale", (h,)
        yield f"{lay}.mlp_layer_scale.scale", (h,)
    yield f"{p}.norm.weight", (h,)
    yield f"{p}.input_proj.weight", (h, lat)
    yield f"{p}.input_proj.bias", (h,)
    yield f"{p}.output_proj.weight", (lat, h)
    yield f"{p}.output_proj.bias", (lat,)


def decoder_weights(d: dict[str, Any], seed: int) -> dict[str, Any]:
    """The speech tokenizer's `decoder.*` tensors of decoder config `d`, fp32, audible (the tiny
    checkpoints' and the released-size benchmark checkpoint's)."""
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omni_mp.models.qwen3_omni.code2wav_weights import init_code2wav
    from omni_mp.models.qwen3_tts.codec_decoder import omni_code2wav_config

    omni = omni_code2wav_config(d, d["latent_dim"])
    torch.manual_seed(seed)
    convs = Qwen3OmniMoeCode2Wav(omni).eval()
    init_code2wav(convs, seed)  # audible (transformers' init is nearly silent)
    state = {
        f"decoder.{k}": v.detach().clone()
        for k, v in convs.state_dict().items()
        if k.split(".")[0] in ("upsample", "decoder")
    }
    front = _draw(_decoder_front_shapes(d), seed + 7, 1.0)
    for k, v in front.items():
        if k.endswith("cluster_usage"):
            front[k] = torch.ones_like(v)  # codebook = embedding_sum / usage
        elif k.endswith(".scale"):
            front[k] = torch.full_like(v, 0.5)  # layer scales felt (released init 0.01)
        elif v.ndim >= 2 and "embedding_sum" not in k:
            front[k] = v * v[0].numel() ** -0.5  # ~ N(0, 1/fan_in)
    return state | front


def _encoder_weights(spec: TinyTtsSpec) -> dict[str, Any]:
    """The Mimi encoder half (cloning's reference codes), transformers' own init, seeded."""
    import torch
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(spec.seed + 11)
    mimi = MimiModel(MimiConfig(**encoder_config(spec))).eval()
    drop = ("decoder.", "decoder_transformer.", "upsample.")
    state = {f"encoder.{k}": v.detach().clone() for k, v in mimi.state_dict().items() if not k.startswith(drop)}
    # transformers' init leaves every codebook vector zero (every code 0): drawn, so that a clip's
    # codes vary and a comparison of them can fail
    g = torch.Generator().manual_seed(spec.seed + 12)
    for k in sorted(k for k in state if k.endswith(".codebook.embed_sum")):
        state[k] = torch.randn(state[k].shape, generator=g)
    return state


def _save(state: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata={"format": "pt"})


def _write_speech_tokenizer(spec: TinyTtsSpec, out: Path) -> None:
    out.mkdir()
    (out / "config.json").write_text(json.dumps(speech_tokenizer_config(spec), indent=2))
    _save(decoder_weights(decoder_config(spec), spec.seed) | _encoder_weights(spec), out / "model.safetensors")
    from transformers import EncodecFeatureExtractor

    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(out)


def _portable_tokenizer_config(out: Path) -> None:
    """tokenizer_config.json readable by transformers 4.57 (the reference) and 5.x (ours): 5.x
    saves the special tokens as a list under `extra_special_tokens`, which 4.57 takes for a dict
    of named tokens and fails on; both read them as `additional_special_tokens`."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    specials = cfg.pop("extra_special_tokens", [])
    if isinstance(specials, list):
        cfg["additional_special_tokens"] = specials
    cfg.update(eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=32768)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def _draw_projection_bias(state: dict[str, Any], seed: int) -> None:
    """`small_to_mtp_projection`'s bias drawn (the other biases are 0), so that a loader that
    dropped it would change the codes."""
    import torch

    key = "talker.code_predictor.small_to_mtp_projection.bias"
    if key in state:
        state[key] = torch.randn(state[key].shape, generator=torch.Generator().manual_seed(seed + 5)) * 0.5


def _build(spec: TinyTtsSpec, out: Path) -> None:
    from omni_mp.models.qwen3_omni.tiny import _token_ids, _train_tokenizer

    tok = _train_tokenizer(spec, out)  # type: ignore[arg-type]  # reads spec.tokenizer_vocab only
    ids = _token_ids(tok)
    _portable_tokenizer_config(out)
    top = top_config(
        spec,
        {
            k: ids[k]
            for k in (
                "im_start_token_id",
                "im_end_token_id",
                "tts_pad_token_id",
                "tts_bos_token_id",
                "tts_eos_token_id",
            )
        },
    )
    shapes: Iterator[tuple[str, Shape]] = _talker_shapes(top["talker_config"])
    state = _draw(shapes, spec.seed, spec.lm_init_std)
    _draw_projection_bias(state, spec.seed)
    if spec.variant == "base":
        speaker = _draw(_speaker_shapes(top["speaker_encoder_config"]), spec.seed + 3, 1.0)
        state |= {k: (v * v[0].numel() ** -0.5 if v.ndim >= 2 else v) for k, v in speaker.items()}
    _save(state, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(top, indent=2))
    # greedy defaults are the caller's; these are the reference's generate() fallbacks
    generation: dict[str, Any] = {"max_new_tokens": 2048, "repetition_penalty": 1.05}
    if spec.subtalker is not None:
        generation |= msgspec.to_builtins(spec.subtalker)
    (out / "generation_config.json").write_text(json.dumps(generation))
    _write_speech_tokenizer(spec, out / "speech_tokenizer")


def build_tiny(spec: TinyTtsSpec, cache_dir: Path | None = None, *, verbose: bool = True) -> Path:
    """The tiny Qwen3-TTS checkpoint dir for `spec`, built once and cached."""
    return build_cached(
        f"qwen3_tts-b{TINY_BUILD}", spec, lambda out: _build(spec, out), cache_dir=cache_dir, verbose=verbose
    )


def build_named(name: str) -> Path:
    """The checkpoint dir of a built-in Qwen3-TTS spec name (of TINY_SPECS)."""
    return build_tiny(TINY_SPECS[name])

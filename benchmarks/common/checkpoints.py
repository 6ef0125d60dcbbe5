"""The omni families' checkpoint dirs at the released sizes with random weights, written by the
project's own code (nothing downloaded), that every system of a side-by-side benchmark loads:

- Qwen2.5-Omni-7B: the config-only dir of omni_mp/models/qwen2_5_omni/shapes.py (random
  token2wav tensors and speakers) plus tokenizer and processor files (omni_bench_dir); thinker
  and talker weights come from vLLM's `load_format: dummy`. `smoke`: the same writer at 1/28
  of the width and depth, which a CPU runs end to end.
- Qwen3-Omni-30B-A3B: config.json of `released_config()` (omni_mp.models.qwen3_omni.tiny, every
  released size written out) and random code2wav tensors; thinker and talker from
  `load_format: dummy`. `smoke`: a view of the tiny checkpoint (same layout, real small weights).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

QWEN2_5_SMOKE_SCALE = 28  # --smoke: the 7B shapes scaled down 28x
# Qwen2.5-Omni: the talker's real codec ids (the rest of its 8448 are control ids: pad, bos,
# eos, ...) and token2wav's audio per code at 24 kHz (50 codes = 1 s)
QWEN2_5_CODEC_IDS = 8192
QWEN2_5_SAMPLES_PER_CODE = 480
QWEN3_SAMPLES_PER_FRAME = 1920  # Qwen3-Omni: code2wav's audio per frame of 16 codes (12.5 frames = 1 s)


def qwen2_5_omni_spec(smoke: bool = False, talker: str = "released") -> Any:
    """The shapes spec (omni_mp.models.qwen2_5_omni.shapes.OmniShapesSpec) of the benchmarks."""
    from omni_mp.models.qwen2_5_omni.shapes import OmniShapesSpec

    return OmniShapesSpec(scale=QWEN2_5_SMOKE_SCALE if smoke else 1, talker=talker)  # type: ignore[arg-type]


def qwen2_5_omni_dir(work_dir: Path, smoke: bool = False, talker: str = "released") -> Path:
    """The one Qwen2.5-Omni model dir of every system (omni_mp, transformers, vllm-omni): the
    shapes dir plus tokenizer and processor files, cached under `work_dir`."""
    from benchmarks.common.omni_bench_dir import with_processor
    from omni_mp.models.qwen2_5_omni.shapes import build_omni_shapes

    return with_processor(build_omni_shapes(qwen2_5_omni_spec(smoke, talker), cache_dir=work_dir))


def qwen3_omni_dir(work_dir: Path, smoke: bool = False) -> Path:
    """The Qwen3-Omni checkpoint dir under `work_dir`: released shapes (config + code2wav
    tensors), or with `smoke` a view of the tiny checkpoint. Written once."""
    out = work_dir / ("qwen3_omni-smoke" if smoke else "qwen3_omni-released")
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if smoke:
        from omni_mp.models.registry import resolve_model

        src = Path(resolve_model("tiny-qwen3-omni"))
        for f in src.iterdir():
            if f.name != "config.json":
                (tmp / f.name).symlink_to(f)
        config = json.loads((src / "config.json").read_text())
    else:
        config = write_qwen3_omni_released(tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    tmp.rename(out)
    return out


def write_qwen3_omni_released(out: Path) -> dict[str, Any]:
    """config.json and generation_config.json of the released sizes and random fp32 code2wav
    tensors (model.safetensors) into `out`; returns the config."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from omni_mp.models.qwen3_omni.tiny import RELEASED_TOKEN_IDS, released_config

    config = released_config()
    config.save_pretrained(out)
    GenerationConfig(eos_token_id=RELEASED_TOKEN_IDS["im_end_token_id"]).save_pretrained(out)
    torch.manual_seed(0)
    code2wav = Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config, dtype=torch.float32).eval()
    tensors = {f"code2wav.{k}": v.detach().contiguous() for k, v in code2wav.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return json.loads((out / "config.json").read_text())


def qwen3_omni_processor_dir(work_dir: Path, smoke: bool = False) -> Path:
    """`qwen3_omni_dir` with what a text prompt also needs (a tokenizer with the released special
    ids, the processor and chat template: omni_bench_dir), in a cached sibling dir; the smoke
    view of the tiny checkpoint has its own."""
    from benchmarks.common.omni_bench_dir import with_processor

    base = qwen3_omni_dir(work_dir, smoke)
    if (base / "tokenizer_config.json").exists():
        return base
    return with_processor(base, "qwen3_omni")


def qwen3_tts_released_dir(work_dir: Path) -> Path:
    """Qwen3-TTS-12Hz-1.7B-CustomVoice's layout at its released sizes with random weights
    (omni_mp.models.qwen3_tts.released_config says which sizes are verified) under `work_dir`,
    written once (again when that config changes): config.json, model.safetensors (every
    `talker.*` tensor, bf16, the code predictor's `small_to_mtp_projection` 2048 -> 1024 included;
    the entry stage reads the text embedding and projection, the talker stage the rest),
    generation_config.json,
    a tokenizer with the released special ids (omni_bench_dir's byte-level BPE of Qwen3-Omni's
    151643 regular tokens and special tokens at 151643..), and speech_tokenizer/ (its config and
    the decoder's fp32 `decoder.*` tensors, audible; no Mimi encoder: CustomVoice clones nothing;
    its feature extractor's preprocessor_config.json, which vllm-omni's talker reads at start-up,
    added to a dir written before it was)."""
    from benchmarks.common.omni_bench_dir import _write_qwen3_processor
    from omni_mp.models.qwen3_tts.released_config import (
        released_decoder_config,
        released_speech_tokenizer_config,
        released_top_config,
    )
    from omni_mp.models.qwen3_tts.tiny import _save, decoder_weights

    out = work_dir / "qwen3_tts-1.7b-released"
    config = released_top_config()
    if (out / "config.json").is_file():
        if json.loads((out / "config.json").read_text()) == config:
            _feature_extractor(out / "speech_tokenizer")
            return out
        shutil.rmtree(out)  # written for other sizes (e.g. before the narrow code predictor)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "speech_tokenizer").mkdir(parents=True)
    _write_qwen3_processor(tmp)
    for extra in ("preprocessor_config.json", "processor_config.json", "chat_template.jinja"):
        (tmp / extra).unlink(missing_ok=True)  # Qwen3-Omni's processor: not this model's
    _save(_random_talker(config), tmp / "model.safetensors")
    (tmp / "generation_config.json").write_text(json.dumps({"max_new_tokens": 2048, "repetition_penalty": 1.05}))
    tok = tmp / "speech_tokenizer"
    (tok / "config.json").write_text(json.dumps(released_speech_tokenizer_config(), indent=1))
    decoder = decoder_weights(released_decoder_config(), seed=0)
    _save(decoder, tok / "model.safetensors")
    _feature_extractor(tok)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))  # last: marks the dir complete
    tmp.rename(out)
    return out


def _feature_extractor(speech_tokenizer: Path) -> None:
    """speech_tokenizer/preprocessor_config.json as the tiny checkpoint's (omni_mp.models.qwen3_tts.tiny):
    the Mimi encoder's input, 24 kHz mono, written once."""
    if (speech_tokenizer / "preprocessor_config.json").is_file():
        return
    from transformers import EncodecFeatureExtractor

    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(speech_tokenizer)


def _random_talker(config: dict[str, Any]) -> dict[str, Any]:
    """Every `talker.*` tensor of `config`, bf16, drawn on the GPU where there is one: matrices
    ~ N(0, 0.02) (transformers' init range), norms 1, biases 0."""
    import torch

    from omni_mp.models.qwen3_tts.tiny import _talker_shapes

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(dev).manual_seed(0)
    out: dict[str, Any] = {}
    for name, shape in sorted(_talker_shapes(config["talker_config"])):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
        elif len(shape) == 1:
            out[name] = torch.zeros(shape, dtype=torch.bfloat16)
        else:
            t = torch.empty(shape, dtype=torch.bfloat16, device=dev).normal_(0.0, 0.02, generator=gen)
            out[name] = t.cpu()
    return out

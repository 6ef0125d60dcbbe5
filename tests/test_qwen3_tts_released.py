"""The released-size Qwen3-TTS config of the GPU benchmark (omni_mp.models.qwen3_tts.released_config,
benchmarks.common.checkpoints.qwen3_tts_released_dir) is one our loaders take, checked on shapes
and configs only (no weights written: the checkpoint is built on the GPU host): the talker view's
config reads as transformers' Qwen3Config at the sizes our talker accepts (the code predictor
1024 wide behind `small_to_mtp_projection`, whose tensors the builder writes), the decoder's sizes
build transformers' code2wav modules (on the meta device) with 1920 samples a frame, the codec ids
sit where the prompt format and its suppression expect them, and the served config parses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from omni_mp.models.qwen3_tts.released_config import (
    SAMPLES_PER_FRAME,
    SPEAKERS,
    released_decoder_config,
    released_speech_tokenizer_config,
    released_top_config,
)
from omni_mp.models.qwen3_tts.talker_view import talker_config_dict
from omni_mp.models.qwen3_tts.tiny import _decoder_front_shapes, _talker_shapes


def test_talker_view_reads_as_a_qwen3_config_our_talker_accepts() -> None:
    from transformers import Qwen3Config

    view = talker_config_dict(released_top_config())
    cfg = Qwen3Config(**{k: v for k, v in view.items() if k != "code_predictor_config"})
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.head_dim) == (2048, 28, 3072, 128)
    cp = view["code_predictor_config"]
    assert cp["hidden_size"] == 1024 < cfg.hidden_size  # behind small_to_mtp_projection
    shapes = dict(_talker_shapes(released_top_config()["talker_config"]))
    assert shapes["talker.code_predictor.small_to_mtp_projection.weight"] == (1024, 2048)
    assert shapes["talker.code_predictor.small_to_mtp_projection.bias"] == (1024,)
    assert shapes["talker.code_predictor.model.codec_embedding.0.weight"] == (2048, 2048)  # the talker's width
    assert shapes["talker.code_predictor.lm_head.0.weight"] == (2048, 1024)
    params = sum(math.prod(s) for s in shapes.values())
    assert 1.7e9 <= params <= 2.1e9, params


def test_codec_ids_in_the_suppressed_range_and_voices_named() -> None:
    t = released_top_config()["talker_config"]
    vocab, cb = t["vocab_size"], t["code_predictor_config"]["vocab_size"]
    ids = [v for k, v in t.items() if k.startswith("codec_") and isinstance(v, int)]
    ids += [*t["codec_language_id"].values(), *t["spk_id"].values()]
    assert len(set(ids)) == len(ids) and all(cb <= i < vocab for i in ids) and vocab - cb == 1024
    assert set(t["spk_id"]) == set(SPEAKERS) and len(SPEAKERS) == 9
    assert {v for v in t["spk_is_dialect"].values() if v} <= set(t["codec_language_id"])


def test_decoder_sizes_build_the_code2wav_modules() -> None:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeCode2WavTransformerModel,
    )

    from omni_mp.models.qwen3_tts.codec_decoder import omni_code2wav_config

    d = released_decoder_config()
    assert released_speech_tokenizer_config()["decode_upsample_rate"] == SAMPLES_PER_FRAME
    assert math.prod(d["upsample_rates"]) * math.prod(d["upsampling_ratios"]) == SAMPLES_PER_FRAME
    tr_cfg = omni_code2wav_config(d, d["hidden_size"])
    tr_cfg.head_dim = d["head_dim"]
    with torch.device("meta"):
        convs = Qwen3OmniMoeCode2Wav(omni_code2wav_config(d, d["latent_dim"]))
        tr = Qwen3OmniMoeCode2WavTransformerModel(tr_cfg)
    front = dict(_decoder_front_shapes(d))
    for name, p in tr.named_parameters():  # the reference's layer tensors are the modules' own
        key = f"decoder.pre_transformer.{name}"
        if key in front:
            assert tuple(p.shape) == front[key], name
    assert front["decoder.pre_conv.conv.weight"] == (d["latent_dim"], d["codebook_dim"], 3)
    assert sum(p.numel() for p in convs.parameters()) > 0


def test_served_config_parses(tmp_path: Path) -> None:
    from benchmarks.common.served import qwen3_tts_served
    from omni_mp.config.validate import parse_config

    (tmp_path / "config.json").write_text(json.dumps(released_top_config()))
    cfg = parse_config(qwen3_tts_served(tmp_path))
    eos = released_top_config()["talker_config"]["codec_eos_token_id"]
    assert cfg.stages[0].sampling.suppress_token_ids == [eos]
    assert all(s.model == str(tmp_path) for s in cfg.stages)

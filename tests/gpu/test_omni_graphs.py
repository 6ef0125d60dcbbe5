"""CUDA graphs (and async scheduling) of the tiny omni pipelines (was launch/gpu_omni_check.py and
launch/gpu_qwen3_omni_check.py): Qwen2.5-Omni's thinker -> talker -> token2wav
(omni_mp/stage_configs/tiny_qwen2_5_omni.yaml) and Qwen3-Omni's thinker -> talker (code
predictor inside its step) -> code2wav (tiny_qwen3_omni.yaml), fp32, with `enforce_eager: true`
and with vLLM's default (torch.compile + CUDA graphs) side by side on the GPU, 8 concurrent
requests (text, audio, image and audio + image prompts, two or three speakers); and async
scheduling against synchronous (`sync-vs-graphs`). Per request the thinker tokens and the talker
codes (Qwen3: its frames, group 0) must be equal and the audio within a relative L2 of
AUDIO_RTOL (tests/gpu/omni_graphs.py). All stages on GPU 0, or the thinker on GPU 0 and the
rest on GPU 1. With OMNI_MP_GPU_ORACLE=1 each request is also compared with transformers on the
CPU (tests/hf_oracle.py, tests/hf_oracle_qwen3_omni.py; reported, not asserted).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.helpers import gpus
from tests.gpu.omni_graphs import (
    COMPARISONS,
    ORACLE,
    QWEN2_5_REQUESTS,
    QWEN3_REQUESTS,
    agreement,
    media,
    oracle_fields,
    run_modes,
    tiny_config,
)
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.gpu

THINKER_TOKENS = 48  # tiny_qwen2_5_omni.yaml's stage 0 max_tokens


def qwen2_5_jobs() -> list[tuple[str, dict[str, Any]]]:
    from omni_mp.wire.messages import SamplingParamsMsg

    return [
        (r["text"], {**media(r), "speaker": r["speaker"], "sampling": {2: SamplingParamsMsg(seed=100 + i)},
                     "deadline_s": 600})
        for i, r in enumerate(QWEN2_5_REQUESTS)
    ]  # fmt: skip


def qwen2_5_oracle(i: int, r: dict[str, Any], thinker: list[int], codes: list[int], audio: Any) -> dict[str, Any]:
    """This request against transformers' generate() on the CPU (same seed)."""
    from omni_mp.models.registry import resolve_model
    from tests.hf_oracle import omni_generate

    want = omni_generate(
        resolve_model("tiny-qwen2_5-omni"), r["text"], audio=tone() if r.get("audio") else None,
        image=pattern() if r.get("image") else None, speaker=r["speaker"], seed=100 + i,
        thinker_max_new_tokens=THINKER_TOKENS,
    )  # fmt: skip
    return {
        **oracle_fields("thinker", thinker, want.thinker_ids, want.thinker_margins),
        **oracle_fields("codes", codes, want.codes, want.code_margins),
    }


def qwen3_jobs() -> list[tuple[str, dict[str, Any]]]:
    return [(r["text"], {**media(r, 1.0, 64), "speaker": r["speaker"], "deadline_s": 900}) for r in QWEN3_REQUESTS]


def qwen3_oracle(i: int, r: dict[str, Any], thinker: list[int], frames: list[int], audio: Any) -> dict[str, Any]:
    """This request against transformers' generate() on the CPU."""
    from omni_mp.models.registry import resolve_model
    from tests.hf_oracle_qwen3_omni import omni_generate

    thinker_tokens = int(tiny_config("tiny_qwen3_omni", "eager", 1).stages[0].sampling.max_tokens)
    want = omni_generate(
        resolve_model("tiny-qwen3-omni"), r["text"],
        audio=tone(1.0) if r.get("audio") else None, image=pattern(64) if r.get("image") else None,
        speaker=r["speaker"], thinker_max_new_tokens=thinker_tokens, talker_max_new_tokens=512,
    )  # fmt: skip
    row = {
        **oracle_fields("thinker", thinker, want.thinker_ids, want.thinker_margins),
        **oracle_fields("frames", frames, want.codes[:, 0].tolist(), want.code_margins),
    }
    if want.wav.shape == audio.shape:
        row["transformers_audio_rel_l2"] = float((audio - want.wav).norm() / want.wav.norm())
    return row


# family -> its shipped tiny config, requests, jobs, what its talker's codes are called, oracle
FAMILIES: dict[str, tuple[str, list[dict[str, Any]], Callable[[], Any], str, Callable[..., dict[str, Any]]]] = {
    "qwen2_5_omni": ("tiny_qwen2_5_omni", QWEN2_5_REQUESTS, qwen2_5_jobs, "codes", qwen2_5_oracle),
    "qwen3_omni": ("tiny_qwen3_omni", QWEN3_REQUESTS, qwen3_jobs, "frames", qwen3_oracle),
}


@pytest.mark.parametrize(
    ("family", "modes", "n_gpus"),
    [pytest.param(f, m, n, marks=gpus(n), id=f"{f}-{m[0]}-vs-{m[1]}-{n}gpu") for f in FAMILIES for m, n in COMPARISONS],
)
def test_two_modes_agree(
    family: str, modes: tuple[str, str], n_gpus: int, report: Callable[[dict[str, Any]], Path]
) -> None:
    config, requests, jobs, codes, oracle = FAMILIES[family]
    results = run_modes(config, modes, n_gpus, jobs())
    rows, failures = agreement(results, modes, requests, codes, oracle if ORACLE else None)
    report({"family": family, "gpus": n_gpus, "compare": modes, "requests": rows})
    assert not failures, "\n".join(failures)

"""CUDA graphs (and async scheduling) for Qwen3-Omni (was launch/gpu_qwen3_omni_check.py): the
tiny thinker -> talker (code predictor inside its step) -> code2wav pipeline
(omni_mp/stage_configs/tiny_qwen3_omni.yaml, fp32) with `enforce_eager: true` and with vLLM's
default (torch.compile + CUDA graphs), side by side on the GPU, 8 concurrent requests (text,
audio, image and audio + image prompts, three speakers); and async scheduling against
synchronous (`sync,graphs`). Per request the thinker tokens and the talker's frames (group 0)
must be equal and the audio within a relative L2 of AUDIO_RTOL. With OMNI_MP_GPU_ORACLE=1 each
request is also compared with transformers on the CPU (tests/hf_oracle_qwen3_omni.py, reported).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.helpers import gpus
from tests.gpu.omni_graphs import (
    AUDIO_RTOL,
    COMPARISONS,
    ORACLE,
    QWEN3_REQUESTS,
    media,
    oracle_fields,
    outputs,
    rel_l2,
    run,
    tiny_config,
)
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.gpu

REQUESTS = QWEN3_REQUESTS


def jobs() -> list[tuple[str, dict[str, Any]]]:
    return [(r["text"], {**media(r, 1.0, 64), "speaker": r["speaker"], "deadline_s": 900}) for r in REQUESTS]


def oracle_row(r: dict[str, Any], thinker: list[int], frames: list[int], audio: Any) -> dict[str, Any]:
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


def compare(results: dict[str, list[Any]], modes: tuple[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per request of the two modes' results, and what disagrees."""
    rows, failures = [], []
    for i, r in enumerate(REQUESTS):
        (te, ce, ae), (tg, cg, ag) = outputs(results[modes[0]][i]), outputs(results[modes[1]][i])
        rel = rel_l2(ae, ag)
        row: dict[str, Any] = {
            "request": i,
            "prompt": r["text"] + (" +audio" if r.get("audio") else "") + (" +image" if r.get("image") else ""),
            "speaker": r["speaker"], "thinker_tokens": len(te), "frames": len(ce), "audio_s": ae.numel() / 24_000,
            "thinker_equal": te == tg, "frames_equal": ce == cg, "audio_rel_l2": rel,
        }  # fmt: skip
        if ORACLE:
            row.update(oracle_row(r, te, ce, ae))
        agree = te == tg and ce == cg and rel <= AUDIO_RTOL
        print(f"[check] req{i} {'AGREE' if agree else 'DIFFER'}: {row}", flush=True)
        rows.append(row)
        if not agree:
            failures.append(f"request {i}: {row}")
    return rows, failures


@pytest.mark.parametrize(
    ("modes", "n_gpus"),
    [pytest.param(m, n, marks=gpus(n), id=f"{m[0]}-vs-{m[1]}-{n}gpu") for m, n in COMPARISONS],
)
def test_two_modes_agree(modes: tuple[str, str], n_gpus: int, report: Callable[[dict[str, Any]], Path]) -> None:
    results = {}
    for label in modes:
        print(f"[check] {label} ({n_gpus} GPU(s))", flush=True)
        results[label], wall = asyncio.run(run(tiny_config("tiny_qwen3_omni", label, n_gpus), jobs()))
        print(f"[check] {label}: {len(REQUESTS)} requests in {wall:.1f}s", flush=True)
    rows, failures = compare(results, modes)
    report({"gpus": n_gpus, "compare": modes, "requests": rows})
    assert not failures, "\n".join(failures)

"""CUDA graphs (and async scheduling) for Qwen2.5-Omni (was launch/gpu_omni_check.py): the tiny
thinker -> talker -> token2wav pipeline (omni_mp/stage_configs/tiny_qwen2_5_omni.yaml, fp32)
with `enforce_eager: true` and with vLLM's default (torch.compile + CUDA graphs), side by side
on the GPU, 8 concurrent requests (text, audio and image prompts, two speakers); and async
scheduling against synchronous (`sync,graphs`). Per request the thinker tokens and the talker
codes must be equal and the audio within a relative L2 of AUDIO_RTOL. With
OMNI_MP_GPU_ORACLE=1 each request is also compared with transformers on the CPU (reported).
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
    QWEN2_5_REQUESTS,
    media,
    oracle_fields,
    outputs,
    rel_l2,
    run,
    tiny_config,
)
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.gpu

THINKER_TOKENS = 48  # the YAML's stage 0 max_tokens
REQUESTS = QWEN2_5_REQUESTS


def jobs() -> list[tuple[str, dict[str, Any]]]:
    from omni_mp.wire.messages import SamplingParamsMsg

    return [
        (r["text"], {**media(r), "speaker": r["speaker"], "sampling": {2: SamplingParamsMsg(seed=100 + i)},
                     "deadline_s": 600})
        for i, r in enumerate(REQUESTS)
    ]  # fmt: skip


def oracle_row(i: int, r: dict[str, Any], thinker: list[int], codes: list[int]) -> dict[str, Any]:
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


@pytest.mark.parametrize(
    ("modes", "n_gpus"),
    [pytest.param(m, n, marks=gpus(n), id=f"{m[0]}-vs-{m[1]}-{n}gpu") for m, n in COMPARISONS],
)
def test_two_modes_agree(modes: tuple[str, str], n_gpus: int, report: Callable[[dict[str, Any]], Path]) -> None:
    results = {}
    for label in modes:
        print(f"[check] {label} ({n_gpus} GPU(s))", flush=True)
        results[label], wall = asyncio.run(run(tiny_config("tiny_qwen2_5_omni", label, n_gpus), jobs()))
        print(f"[check] {label}: {len(REQUESTS)} requests in {wall:.1f}s", flush=True)
    rows, failures = [], []
    for i, r in enumerate(REQUESTS):
        (te, ce, ae), (tg, cg, ag) = outputs(results[modes[0]][i]), outputs(results[modes[1]][i])
        rel = rel_l2(ae, ag)
        row = {
            "request": i,
            "prompt": r["text"] + (" +audio" if r.get("audio") else "") + (" +image" if r.get("image") else ""),
            "thinker_tokens": len(te), "codes": len(ce), "audio_s": ae.numel() / 24_000,
            "thinker_equal": te == tg, "codes_equal": ce == cg, "audio_rel_l2": rel,
        }  # fmt: skip
        if ORACLE:
            row.update(oracle_row(i, r, te, ce))
        agree = te == tg and ce == cg and rel <= AUDIO_RTOL
        print(f"[check] req{i} {'AGREE' if agree else 'DIFFER'}: {row}", flush=True)
        rows.append(row)
        if not agree:
            failures.append(f"request {i}: {row}")
    report({"gpus": n_gpus, "compare": modes, "requests": rows})
    assert not failures, "\n".join(failures)


"""CUDA graphs of the tiny Qwen3-TTS pipeline (omni_mp/stage_configs/tiny_qwen3_tts.yaml: our vLLM
talker with its code predictor inside its step, then the streaming 12 Hz codec decoder), fp32,
greedy, every stage on GPU 0: with vLLM's default (torch.compile + CUDA graphs, the code
predictor's own graphs) and the decoder's CUDA graphs (its front and transformer as one graph
per row bucket, its convolutions) against `enforce_eager: true` and the decoder eager, one
pipeline each, the same 4 requests
sent at once (three preset voices, instructions, a language). Per request: the talker's codes
(group 0, one a step) equal, and the waveform within a relative L2 of AUDIO_RTOL (it depends on
all 16 codes of every frame, so a differing code 1..15 shows there); and with graphs, each
request sent alone gives what it gave among the 4 (batching changes nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.omni_graphs import AUDIO_RTOL, rel_l2, tiny_config

pytestmark = pytest.mark.gpu

STEPS = 40  # talker steps a request: 39 frames, 3.1 s of audio
REQUESTS: list[dict[str, Any]] = [
    {"text": "hello there, how are you?", "speaker": "vivian", "params": {"instructions": "speak slowly"}},
    {"text": "the quick brown fox jumps over the lazy dog", "speaker": "ryan", "params": {}},
    {"text": "good morning to you", "speaker": "dylan", "params": {"language": "english"}},
    {"text": "graphs must not change the answer", "speaker": "vivian", "params": {}},
]


def _kwargs(r: dict[str, Any]) -> dict[str, Any]:
    from omni_mp.wire.messages import SamplingParamsMsg

    sampling = SamplingParamsMsg(max_tokens=STEPS, min_tokens=2, temperature=0.0, repetition_penalty=1.05)
    return {"speaker": r["speaker"], "params": r["params"], "sampling": {0: sampling}, "deadline_s": 600}


def _outputs(done: Any) -> tuple[list[int], Any]:
    out = {o.stage_id: o for o in done.outputs}
    return list(out[0].token_ids), out[1].audio


async def _serve(mode: str, alone_too: bool) -> dict[str, list[tuple[list[int], Any]]]:
    """The requests at once through the tiny pipeline in `mode`; with `alone_too` then each alone."""
    from omni_mp.client.omni_client import AsyncOmniClient
    from omni_mp.control.embedded import embedded_pipeline

    with embedded_pipeline(_config(mode), progress=lambda m: print(f"  {m}", flush=True)) as coord:
        async with AsyncOmniClient(coord.client_endpoint) as client:
            together = await asyncio.gather(*(client.generate(r["text"], **_kwargs(r)) for r in REQUESTS))
            alone = [await client.generate(r["text"], **_kwargs(r)) for r in REQUESTS] if alone_too else []
    return {"together": [_outputs(d) for d in together], "alone": [_outputs(d) for d in alone]}


def _config(mode: str) -> Any:
    """The tiny pipeline in `mode`; eager: the decoder's CUDA graphs off too."""
    import msgspec

    cfg = tiny_config("tiny_qwen3_tts", mode, 1)
    if mode != "eager":
        return cfg
    stages = [
        msgspec.structs.replace(s, diffusion=msgspec.structs.replace(s.diffusion, cuda_graphs=False))
        if s.kind == "diffusion"
        else s
        for s in cfg.stages
    ]
    return msgspec.structs.replace(cfg, stages=stages)


def _compare(a: list[tuple[list[int], Any]], b: list[tuple[list[int], Any]], what: str) -> tuple[list[dict], list[str]]:
    rows, failures = [], []
    for i, ((ca, wa), (cb, wb)) in enumerate(zip(a, b, strict=True)):
        rel = rel_l2(wa, wb)
        row = {
            "request": i,
            "codes": len(ca),
            "codes_equal": ca == cb,
            "audio_s": wa.numel() / 24_000,
            "audio_rel_l2": rel,
        }
        print(f"[check] {what} req{i}: {row}", flush=True)
        rows.append(row)
        if ca != cb or rel > AUDIO_RTOL:
            failures.append(f"{what} request {i}: {row}")
    return rows, failures


def test_graphs_equal_eager_and_batching_changes_nothing(report: Callable[[dict[str, Any]], Path]) -> None:
    eager = asyncio.run(_serve("eager", alone_too=False))
    graphs = asyncio.run(_serve("graphs", alone_too=True))
    modes, f1 = _compare(eager["together"], graphs["together"], "eager vs graphs")
    batch, f2 = _compare(graphs["together"], graphs["alone"], "graphs: 4 at once vs alone")
    report({"audio_rtol": AUDIO_RTOL, "steps": STEPS, "eager_vs_graphs": modes, "together_vs_alone": batch})
    assert all(c and w is not None and w.numel() > 0 for c, w in eager["together"]), "a request gave no audio"
    assert not f1 + f2, "\n".join(f1 + f2)

"""Driving a diffusion engine in-process as the stage loop does, for the streaming decoders' tests
(Qwen3-Omni code2wav, Qwen3-TTS's codec decoder)."""

from __future__ import annotations

import torch

from omni_mp.engines.base import Extension
from omni_mp.engines.diffusion.engine import DiffusionEngine
from tests.launcher import engine_is_empty


def worker_streams(eng: DiffusionEngine) -> set[str]:
    return set(eng.driver.core.collective_rpc(lambda w: set(w.model_runner.model.streams))[0])


def run(
    eng: DiffusionEngine, feeds: dict[str, list[int]], per_step: dict[str, int], stream: bool = True
) -> tuple[dict[str, list[torch.Tensor]], dict[str, str | None], list[set[str]]]:
    """Feed each request `per_step[rid]` codes before every engine step (the first batch at
    submit) until all are in, step until idle. Audio chunks and finish reasons per request,
    and which requests got audio in each step."""
    fed = {}
    for rid, ids in feeds.items():
        n = per_step[rid]
        eng.submit(rid, ids[:n], closed=n >= len(ids), stream=stream)
        fed[rid] = min(n, len(ids))
    audio: dict[str, list[torch.Tensor]] = {}
    reasons: dict[str, str | None] = {}
    batches: list[set[str]] = []
    for _ in range(10_000):
        for rid, ids in feeds.items():
            if fed[rid] < len(ids) and rid in eng.batcher.requests:
                n = min(per_step[rid], len(ids) - fed[rid])
                eng.extend(rid, Extension(input_ids=ids[fed[rid] : fed[rid] + n], closed=fed[rid] + n == len(ids)))
                fed[rid] += n
        if engine_is_empty(eng):
            return audio, reasons, batches
        outs, _ = eng.step()
        batches.append({o.request_id for o in outs if o.info is not None})
        for o in outs:
            if o.info is not None:
                audio.setdefault(o.request_id, []).append(torch.as_tensor(o.info["audio"]))
            if o.finished:
                reasons[o.request_id] = o.finish_reason
        reasons.update(eng.take_failed())
    raise AssertionError("engine did not go idle")

"""The tiny omni pipelines of omni_mp/stage_configs/ on the GPU in two modes side by side (CUDA
graphs against eager, or async scheduling against synchronous), eight concurrent requests of
text, audio and image prompts: what tests/gpu/test_omni_graphs.py and test_mps.py run. With
OMNI_MP_GPU_ORACLE=1 test_omni_graphs also compares each request with transformers on the CPU
(reported, not asserted: a GPU token may flip at a near tie)."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import yaml

from tests.synthetic_media import pattern, tone

ORACLE = os.environ.get("OMNI_MP_GPU_ORACLE") == "1"
AUDIO_RTOL = 1e-3  # relative L2 between the two runs' waveforms (same codes, same seed)
# What each mode sets on the thinker and talker: eager (no compile, no graphs), graphs (vLLM's
# default: torch.compile + CUDA graphs, async scheduling), sync (graphs, async scheduling off).
MODES: dict[str, dict[str, Any]] = {
    "eager": {"enforce_eager": True},
    "graphs": {"enforce_eager": False},
    "sync": {"enforce_eager": False, "async_scheduling": False},
}
# The comparisons: eager,graphs checks the CUDA graphs; sync,graphs checks async scheduling (the
# talker's gate included) against synchronous scheduling. (modes, GPUs)
COMPARISONS = [(("eager", "graphs"), 1), (("eager", "graphs"), 2), (("sync", "graphs"), 1)]

QWEN2_5_REQUESTS: list[dict[str, Any]] = [
    {"text": "Tell me a short story about the sea.", "speaker": "Chelsie"},
    {"text": "What do you hear?", "audio": True, "speaker": "Ethan"},
    {"text": "Describe the picture.", "image": True, "speaker": "Chelsie"},
    {"text": "Hello there, how are you?", "speaker": "Ethan"},
    {"text": "Listen and look.", "audio": True, "image": True, "speaker": "Chelsie"},
    {"text": "Graphs must not change the answer.", "speaker": "Ethan"},
    {"text": "What colour is it?", "image": True, "speaker": "Ethan"},
    {"text": "Count to five.", "speaker": "Chelsie"},
]
# the same prompts with Qwen3-Omni's three speakers
QWEN3_REQUESTS: list[dict[str, Any]] = [
    {**r, "speaker": speaker}
    for r, speaker in zip(
        QWEN2_5_REQUESTS, ("ethan", "chelsie", "aiden", "chelsie", "ethan", "aiden", "ethan", "chelsie"), strict=True
    )
]


def tiny_config(yaml_name: str, mode: str, gpus: int) -> Any:
    """A shipped tiny config's pipeline with every stage on the GPU(s): all on GPU 0 (`gpus` 1),
    or the thinker on GPU 0 and the rest on GPU 1 (`gpus` 2); the AR stages in `mode`, each
    with a fixed KV cache (engines share a GPU: a share of the whole GPU would not do)."""
    from omni_mp.config.validate import parse_config
    from omni_mp.stage_configs import shipped_config

    raw = yaml.safe_load(shipped_config(yaml_name).read_text())
    raw["name"] = f"{raw['name']}_{mode}"
    for stage in raw["stages"]:
        args = stage.setdefault("engine_args", {})
        if stage.get("kind") != "diffusion":
            args.update(MODES[mode])
            args["kv_cache_memory_bytes"] = 1 << 30
        stage["devices"] = [0] if gpus == 1 or stage["id"] == 0 else [1]
    return parse_config(raw)


def media(r: dict[str, Any], seconds: float = 2.0, side: int = 56) -> dict[str, Any]:
    """The request's synthetic audio (a tone) and image (a pattern), where it has them."""
    return {
        "audios": [(torch.from_numpy(tone(seconds)), 16_000)] if r.get("audio") else [],
        "images": [torch.from_numpy(pattern(side))] if r.get("image") else [],
    }


async def run(
    cfg: Any, jobs: list[tuple[str, dict[str, Any]]], inspect: Callable[[Any], None] | None = None
) -> tuple[list[Any], float]:
    """`cfg` served, `jobs` (prompt, generate() keywords) sent at once; `inspect` sees the running
    coordinator first. Their Finished events in job order, and the wall time."""
    from omni_mp.client.omni_client import AsyncOmniClient
    from omni_mp.control.embedded import embedded_pipeline

    with embedded_pipeline(cfg, progress=lambda m: print(f"  {m}", flush=True)) as coord:
        if inspect is not None:
            inspect(coord)
        async with AsyncOmniClient(coord.client_endpoint) as client:
            t0 = time.perf_counter()
            done = await asyncio.gather(*(client.generate(text, **kw) for text, kw in jobs))
            return list(done), time.perf_counter() - t0


def run_modes(yaml_name: str, modes: tuple[str, str], gpus: int, jobs: list[tuple[str, dict[str, Any]]]) -> dict:
    """The jobs through the shipped tiny config in each mode, one pipeline after the other."""
    results = {}
    for label in modes:
        print(f"[check] {label} ({gpus} GPU(s))", flush=True)
        results[label], wall = asyncio.run(run(tiny_config(yaml_name, label, gpus), jobs))
        print(f"[check] {label}: {len(jobs)} requests in {wall:.1f}s", flush=True)
    return results


def agreement(
    results: dict[str, list[Any]],
    modes: tuple[str, str],
    requests: list[dict[str, Any]],
    codes: str,
    oracle: Callable[[int, dict[str, Any], list[int], list[int], torch.Tensor], dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per request of the two modes: thinker tokens equal, talker `codes` ("codes", or Qwen3's
    group-0 "frames") equal, audio within AUDIO_RTOL (relative L2); a row each (with `oracle`'s
    fields where given) and what disagrees."""
    rows, failures = [], []
    for i, r in enumerate(requests):
        (te, ce, ae), (tg, cg, ag) = outputs(results[modes[0]][i]), outputs(results[modes[1]][i])
        rel = rel_l2(ae, ag)
        row: dict[str, Any] = {
            "request": i,
            "prompt": r["text"] + (" +audio" if r.get("audio") else "") + (" +image" if r.get("image") else ""),
            "speaker": r["speaker"], "thinker_tokens": len(te), codes: len(ce), "audio_s": ae.numel() / 24_000,
            "thinker_equal": te == tg, f"{codes}_equal": ce == cg, "audio_rel_l2": rel,
        }  # fmt: skip
        if oracle is not None:
            row.update(oracle(i, r, te, ce, ae))
        agree = te == tg and ce == cg and rel <= AUDIO_RTOL
        print(f"[check] req{i} {'AGREE' if agree else 'DIFFER'}: {row}", flush=True)
        rows.append(row)
        if not agree:
            failures.append(f"request {i}: {row}")
    return rows, failures


def outputs(done: Any) -> tuple[list[int], list[int], torch.Tensor]:
    """Thinker tokens, the talker's codes (group 0 for Qwen3; without the stop code, as
    transformers cuts them), audio."""
    out = {o.stage_id: o for o in done.outputs}
    codes = out[1].token_ids[:-1] if out[1].finish_reason == "stop" else out[1].token_ids
    return out[0].token_ids, codes, out[2].audio


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |a| (inf where the shapes differ or `a` is silent)."""
    return float((a - b).norm() / a.norm()) if a.shape == b.shape and a.norm() > 0 else math.inf


def oracle_fields(what: str, got: list[int], ref: list[int], margins: list[float]) -> dict[str, Any]:
    """A GPU result against transformers (CPU): equal, or where it first differs and transformers'
    top-2 logit margin there (near ties flip on kernel rounding)."""
    first = next((k for k, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), None)
    row: dict[str, Any] = {f"transformers_{what}_equal": got == ref}
    if first is not None:
        row[f"transformers_{what}_first_diff"] = first
        row[f"transformers_{what}_margin_there"] = margins[first] if first < len(margins) else None
    return row

"""CUDA graphs of the AR stages (was launch/gpu_graphs_check.py): the tiny thinker -> talker chain
(fp32) with `enforce_eager: true` and with vLLM's default (torch.compile + CUDA graphs), side by
side, and both against transformers on the same checkpoints (CPU). Per request: the thinker
tokens, the talker tokens and the streamed hidden states (last layer and layer 1) must agree:
graphs == eager token for token, graphs == transformers but at a near tie, hidden states within
RTOL of eager and 10 x RTOL of transformers. Both stages on GPU 0, and on GPUs 0 and 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.helpers import gpus
from tests.hf_oracle import greedy, greedy_hidden, talker_greedy, tokenize

pytestmark = pytest.mark.gpu

# Hidden states, eager vs graphs: max |difference| / max |value|. fp32, but compiled kernels
# fuse and reorder float sums (and GPU matmuls may use TF32), so not bit-exact.
RTOL = 2e-3
# A token that differs from transformers (CPU, fp32) is accepted only at a near tie: the
# transformers top-2 logit margin at the first differing step is below this.
NEAR_TIE = 0.05
PROMPTS = [
    "Hello world, how are you?",
    "The quick brown fox",
    "Tell me a story about a robot",
    "1 2 3 4 5 6 7 8",
    "Why is the sky blue?",
    "A",
    "Omni models speak while they think",
    "Graphs must not change the answer",
]


def pipeline(eager: bool, devices: tuple[list[int], list[int]]) -> dict[str, Any]:
    engine = {
        "dtype": "float32",
        "enforce_eager": eager,
        "max_model_len": 1024,
        "max_num_seqs": 16,
        "seed": 0,
    }
    if devices[0]:
        # A fixed KV budget: with a utilization share, a stage that profiles while the other
        # allocates its cache counts that allocation as its own and finds no memory left
        # (seen on an 80 GB H100 with two stages on one GPU).
        engine["kv_cache_memory_bytes"] = 1 << 30
    sampling = {"temperature": 0.0, "ignore_eos": True}
    return {
        "name": f"graphs_check_{'eager' if eager else 'graphs'}",
        "stages": [
            {
                "id": 0,
                "model": "tiny-qwen2",
                "devices": devices[0],
                "final_output": True,
                "hidden_states": {"layers": [1]},
                "engine_args": engine,
                "sampling": {**sampling, "max_tokens": 16},
            },
            {
                "id": 1,
                "model": "tiny-qwen2-b",
                "devices": devices[1],
                "inputs": [0],
                "processor": "thinker_to_talker",
                "final_output": True,
                "engine_args": engine,
                "sampling": {**sampling, "max_tokens": 24},
            },
        ],
    }


def lengths(i: int) -> tuple[int, int]:
    """(thinker tokens, talker tokens) of request i: different per request, talker longer."""
    return 8 + 3 * i, 12 + 4 * i


async def run_requests(endpoint: str) -> list[dict[str, Any]]:
    from omni_mp.client.omni_client import AsyncOmniClient
    from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk

    async def one(i: int, client: AsyncOmniClient) -> dict[str, Any]:
        n0, n1 = lengths(i)
        sampling = {
            0: SamplingParamsMsg(max_tokens=n0, ignore_eos=True),
            1: SamplingParamsMsg(max_tokens=n1, ignore_eos=True),
        }
        tokens: dict[int, list[int]] = {0: [], 1: []}
        rows: dict[str, list[torch.Tensor]] = {}
        async for ev in client.stream(PROMPTS[i], sampling=sampling, hidden_states=True, timeout_s=600):
            if isinstance(ev, Finished):
                break
            assert isinstance(ev, StageOutputChunk)
            tokens[ev.stage_id] += ev.token_ids
            if ev.hidden is not None:
                rows.setdefault("hidden_states", []).append(ev.hidden.last.clone())
                for lr in ev.hidden.layers:
                    rows.setdefault(f"hidden_states.layer{lr.layer}", []).append(lr.rows.clone())
        return {"tokens": tokens, "hidden": {k: torch.cat(v) for k, v in rows.items()}}

    async with AsyncOmniClient(endpoint) as client:
        return list(await asyncio.gather(*(one(i, client) for i in range(len(PROMPTS)))))


def oracle(i: int) -> dict[str, Any]:
    from omni_mp.models.registry import resolve_model

    thinker, talker = resolve_model("tiny-qwen2"), resolve_model("tiny-qwen2-b")
    ids = tokenize(thinker, PROMPTS[i])
    n0, n1 = lengths(i)
    t_tokens, layers = greedy_hidden(thinker, ids, n0)
    _, t_margins = greedy(thinker, ids, n0)
    last = layers[-1]
    codes, c_margins = talker_greedy(talker, last[: len(ids)], last[len(ids) :], n1)
    return {
        "prompt_len": len(ids),
        "tokens": {0: t_tokens, 1: codes},
        "margins": {0: t_margins, 1: c_margins},
        "hidden": {"hidden_states": last, "hidden_states.layer1": layers[1]},
    }


def rel_diff(a: torch.Tensor | None, b: torch.Tensor | None, rows: int | None = None) -> float:
    """max |a - b| / max |b| over the first `rows` rows (all by default)."""
    if a is None or b is None or a.shape[1:] != b.shape[1:]:
        return float("inf")
    n = min(a.shape[0], b.shape[0], a.shape[0] if rows is None else rows)
    if n == 0:
        return float("inf")
    a, b = a[:n].float(), b[:n].float()
    return float((a - b).abs().max() / b.abs().max())


def vs_transformers(got: list[int], want: list[int], margins: list[float]) -> tuple[bool, str, int]:
    """(acceptable, description, first differing step or len)."""
    first = next((k for k, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), None)
    if first is None and len(got) == len(want):
        return True, "==HF", len(got)
    k = first if first is not None else min(len(got), len(want))
    near = k < len(margins) and margins[k] < NEAR_TIE
    return (
        near,
        f"differs from HF at step {k} (HF top-2 margin {margins[k] if k < len(margins) else float('nan'):.3f})",
        k,
    )


def compare(results: dict[str, list[dict[str, Any]]], ref: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """One printed row per request, and what disagrees (empty: everything agrees)."""
    rows, failures = [], []
    for i in range(len(PROMPTS)):
        e, g, h = results["eager"][i], results["graphs"][i], ref[i]
        cells = []
        agree_rows = None
        for stage in (0, 1):
            same = e["tokens"][stage] == g["tokens"][stage]
            hf_ok, hf_text, first = vs_transformers(g["tokens"][stage], h["tokens"][stage], h["margins"][stage])
            cells.append(f"eager==graphs {same}, {hf_text} ({len(g['tokens'][stage])} tokens)")
            if not (same and hf_ok):
                failures.append(f"request {i} stage {stage}: eager==graphs {same}, {hf_text}")
            if stage == 0:  # states of the prompt and of the tokens before the first difference
                agree_rows = h["prompt_len"] + first
        rows_want = h["prompt_len"] + len(h["tokens"][0]) - 1  # the prompt and every token but the last
        for key in ("hidden_states", "hidden_states.layer1"):
            counts = [r["hidden"][key].shape[0] if key in r["hidden"] else 0 for r in (e, g)]
            if counts != [rows_want, rows_want]:
                cells.append(f"{key}: {counts} rows (eager, graphs), want {rows_want}")
                failures.append(f"request {i}: {cells[-1]}")
            d_eg = rel_diff(e["hidden"].get(key), g["hidden"].get(key))
            d_hf = rel_diff(g["hidden"].get(key), h["hidden"][key], agree_rows)
            cells.append(f"{d_eg:.1e}, {d_hf:.1e}")
            if not (d_eg <= RTOL and d_hf <= 10 * RTOL):
                failures.append(f"request {i} {key}: eager-graphs {d_eg:.1e}, graphs-HF {d_hf:.1e} ({RTOL=})")
        rows.append(f"{i} | " + " | ".join(cells))
    return rows, failures


@pytest.mark.parametrize("n_gpus", [1, pytest.param(2, marks=gpus(2))])
def test_graphs_agree_with_eager_and_transformers(n_gpus: int, report: Callable[[dict[str, Any]], Path]) -> None:
    from omni_mp.config.validate import parse_config
    from omni_mp.control.embedded import embedded_pipeline

    devices: tuple[list[int], list[int]] = ([0], [0] if n_gpus == 1 else [1])
    results = {}
    for eager in (True, False):
        name = "eager" if eager else "graphs"
        cfg = parse_config(pipeline(eager, devices))
        print(f"[check] {name}: starting the pipeline ...", flush=True)
        with embedded_pipeline(cfg, progress=lambda m: print(f"[omni_mp] {m}", flush=True)) as coord:
            results[name] = asyncio.run(run_requests(coord.client_endpoint))
    print("[check] transformers oracle ...", flush=True)
    ref = [oracle(i) for i in range(len(PROMPTS))]
    rows, failures = compare(results, ref)
    print(f"\nreq | thinker | talker | hidden last: rel. diff eager-graphs, graphs-HF | layer 1 ({RTOL=})")
    print("\n".join(rows), flush=True)
    report({"gpus": n_gpus, "rows": rows, "failures": failures})
    assert not failures, "\n".join(failures)

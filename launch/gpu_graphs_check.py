"""CUDA graphs check: the tiny thinker -> talker chain (fp32) with `enforce_eager: true` and
with vLLM's default (torch.compile + CUDA graphs), side by side, and both against
transformers on the same checkpoints. Per request it prints whether the thinker tokens,
the talker tokens and the streamed hidden states (last layer and layer 1) agree.

    python launch/gpu_graphs_check.py                 # both stages on GPU 0
    python launch/gpu_graphs_check.py --gpus 2        # stage 0 on GPU 0, stage 1 on GPU 1
    python launch/gpu_graphs_check.py --cpu           # CPU: torch.compile without graphs

Exit code 0 when everything agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_mp.client import AsyncOmniClient  # noqa: E402
from omni_mp.config import parse_config  # noqa: E402
from omni_mp.control.embedded import embedded_pipeline  # noqa: E402
from omni_mp.models.tiny import resolve_model  # noqa: E402
from omni_mp.wire.payload import Finished, SamplingParamsMsg, StageOutputChunk  # noqa: E402
from tests.hf_oracle import greedy_hidden, talker_greedy, tokenize  # noqa: E402

ATOL = 1e-3  # fp32; compiled kernels may fuse and reorder float sums
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
        engine["gpu_memory_utilization"] = 0.15
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
    async def one(i: int, client: AsyncOmniClient) -> dict[str, Any]:
        n0, n1 = lengths(i)
        sampling = {
            0: SamplingParamsMsg(max_tokens=n0, ignore_eos=True),
            1: SamplingParamsMsg(max_tokens=n1, ignore_eos=True),
        }
        tokens: dict[int, list[int]] = {0: [], 1: []}
        rows: dict[str, list[torch.Tensor]] = {}
        async for ev in client.stream(PROMPTS[i], sampling=sampling, timeout_s=600):
            if isinstance(ev, Finished):
                break
            assert isinstance(ev, StageOutputChunk)
            tokens[ev.stage_id] += ev.token_ids
            for key, value in (ev.additional_information or {}).items():
                if key.startswith("hidden_states"):
                    rows.setdefault(key, []).append(value.clone())
        return {"tokens": tokens, "hidden": {k: torch.cat(v) for k, v in rows.items()}}

    async with AsyncOmniClient(endpoint) as client:
        return list(await asyncio.gather(*(one(i, client) for i in range(len(PROMPTS)))))


def oracle(i: int) -> dict[str, Any]:
    thinker, talker = resolve_model("tiny-qwen2"), resolve_model("tiny-qwen2-b")
    ids = tokenize(thinker, PROMPTS[i])
    n0, n1 = lengths(i)
    t_tokens, layers = greedy_hidden(thinker, ids, n0)
    last = layers[-1]
    codes, _ = talker_greedy(talker, last[: len(ids)], last[len(ids) :], n1)
    return {"tokens": {0: t_tokens, 1: codes}, "hidden": {"hidden_states": last, "hidden_states.layer1": layers[1]}}


def max_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None or a.shape != b.shape:
        return float("inf")
    return float((a.float() - b.float()).abs().max())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=1, choices=[1, 2])
    p.add_argument("--cpu", action="store_true", help="run on the CPU (torch.compile, no CUDA graphs)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    devices: tuple[list[int], list[int]] = ([], []) if args.cpu else ([0], [0] if args.gpus == 1 else [1])
    results = {}
    for eager in (True, False):
        name = "eager" if eager else "graphs"
        cfg = parse_config(pipeline(eager, devices))
        print(f"[check] {name}: starting the pipeline ...", flush=True)
        with embedded_pipeline(cfg, progress=lambda m: print(f"[omni_mp] {m}", flush=True)) as coord:
            results[name] = asyncio.run(run_requests(coord.client_endpoint))
    print("[check] transformers oracle ...", flush=True)
    ref = [oracle(i) for i in range(len(PROMPTS))]
    ok = True
    print(
        f"\nreq | thinker tokens | talker tokens | hidden last: max|eager-graphs|, max|graphs-HF| | layer 1 ({ATOL=})"
    )
    for i in range(len(PROMPTS)):
        e, g, h = results["eager"][i], results["graphs"][i], ref[i]
        cells = []
        for stage in (0, 1):
            same = e["tokens"][stage] == g["tokens"][stage]
            hf = g["tokens"][stage] == h["tokens"][stage]
            cells.append(f"eager==graphs {same}, ==HF {hf} ({len(g['tokens'][stage])})")
            ok &= same and hf
        for key in ("hidden_states", "hidden_states.layer1"):
            d_eg = max_diff(e["hidden"].get(key), g["hidden"].get(key))
            d_hf = max_diff(g["hidden"].get(key), h["hidden"][key])
            cells.append(f"{d_eg:.1e}, {d_hf:.1e}")
            ok &= d_eg <= ATOL and d_hf <= ATOL
        print(f"{i} | " + " | ".join(cells))
    device = "CPU" if args.cpu else torch.cuda.get_device_name(0) if torch.cuda.is_available() else "?"
    print(f"\n[check] {device}: {'ALL AGREE' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

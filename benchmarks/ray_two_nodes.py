"""What crosses the network between stages on two hosts: the tiny chains run with
`placement: ray` on a local two-node Ray cluster (loopback; tcp + CURVE between the stages,
no shared memory), and every stage's per-step timeline counts the bytes it sent downstream.

    python -m benchmarks.ray_two_nodes [--requests 8]

Prints, per pipeline: bytes per step and per request from stage 0 to stage 1, and the part
that is hidden-state rows (rows x hidden size x bytes per value), so the figure scales to
real models: a Qwen2.5-Omni-7B thinker row is 3584 x 2 bytes (bf16).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # see omni_mp.control.ray_local

from omni_mp.client.omni_client import AsyncOmniClient
from omni_mp.config.validate import parse_config
from omni_mp.control.embedded import embedded_pipeline
from omni_mp.control.ray_local import local_cluster
from omni_mp.stage.timeline import PROFILE_DIR_ENV
from omni_mp.wire.keys import client_identity, generate

ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 16, "seed": 0}
SAMPLING = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 32}


def pipeline(name: str, address: str, keys: Path) -> dict[str, Any]:
    talker = name == "thinker_talker"
    return {
        "name": name,
        "placement": {"kind": "ray", "address": address},
        "endpoints": {"transport": "tcp", "host": "127.0.0.1"},
        "security": {"keys": str(keys)},
        "stages": [
            {
                "id": 0,
                "model": "tiny-qwen2",
                "engine_args": ENGINE,
                "sampling": SAMPLING,
                "ray_resources": {"node_a": 0.01},
                **({"hidden_states": {}} if talker else {}),
            },
            {
                "id": 1,
                "model": "tiny-qwen2-b",
                "inputs": [0],
                "processor": "thinker_to_talker" if talker else "continue_tokens",
                "final_output": True,
                "engine_args": ENGINE,
                "sampling": SAMPLING,
                "ray_resources": {"node_b": 0.01},
            },
        ],
    }


async def run(endpoint: str, keys: Path, n: int) -> None:
    async with AsyncOmniClient(endpoint, keys=client_identity(keys, "bench")) as client:
        await asyncio.gather(*(client.generate(f"request {i}: hello there", timeout_s=300) for i in range(n)))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=8)
    args = p.parse_args()
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))  # stages import this tree
    work = Path(tempfile.mkdtemp(prefix="omni_mp-ray-bench-"))
    keys = work / "keys"
    generate(keys, ["bench"])
    rows = []
    with local_cluster(nodes=2) as cluster:
        for name in ("chain", "thinker_talker"):
            profile = work / name
            os.environ[PROFILE_DIR_ENV] = str(profile)
            with embedded_pipeline(parse_config(pipeline(name, cluster.address, keys))) as coord:
                asyncio.run(run(coord.client_endpoint, keys, args.requests))
            # Stage 0's timeline is written on its node's side of this machine.
            doc = json.loads(next(profile.glob("stage0-*.json")).read_text())
            steps = [dict(zip(doc["fields"], s, strict=True)) for s in doc["steps"]]
            sent = [s for s in steps if s["wire_bytes"]]
            total = sum(s["wire_bytes"] for s in sent)
            hidden_rows = sum(s["rows"] for s in sent)
            rows.append((name, len(sent), total, hidden_rows))
    print(f"\n{args.requests} concurrent requests, 32 tokens each; stage 0 on node_a, stage 1 on node_b (tcp + CURVE)")
    print("| pipeline | steps sent | bytes per step (mean) | bytes per request | hidden-state rows per request |")
    print("|---|---|---|---|---|")
    for name, n_steps, total, hidden_rows in rows:
        print(
            f"| {name} | {n_steps} | {total / max(n_steps, 1):.0f} | {total / args.requests:.0f} "
            f"| {hidden_rows / args.requests:.0f} (x 64 x 4 bytes here; x 3584 x 2 at 7B) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""AR stage cost of per-step hidden-state output, and of the thinker -> talker pipeline.

Three pipelines run side by side in one process tree, measured in alternating rounds:
  off     one AR stage, hidden-state output off
  on      the same stage streaming the hidden states of every token (to the coordinator)
  chain   tiny_thinker_talker: that stage feeding a talker stage step by step
Each round sends `--requests` concurrent requests of `--tokens` tokens to one pipeline.
Prints generated tokens/s per pipeline, the on/off ratio (the hidden-state overhead; target
<= 10%) and the chain's end-to-end time against stage 0 alone.

    python -m benchmarks.ar_hidden_states [--gpu] [--rounds 3] [--requests 8] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import threading
import time
from typing import Any

import yaml

from omni_mp.client.omni_client import AsyncOmniClient
from omni_mp.config.validate import parse_config
from omni_mp.control.coordinator import Coordinator
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import SamplingParamsMsg


def configs(gpu: bool, model: str | None) -> dict[str, Any]:
    name = "tiny_thinker_talker_gpu.yaml" if gpu else "tiny_thinker_talker.yaml"
    chain = yaml.safe_load((CONFIG_DIR / name).read_text())
    if model is not None:  # both stages: the talker's width must equal the thinker's
        for stage in chain["stages"]:
            stage["model"] = model
    thinker = copy.deepcopy(chain["stages"][0])
    on = {"name": "on", "stages": [thinker]}
    off_stage = copy.deepcopy(thinker)
    off_stage.pop("hidden_states")
    off = {"name": "off", "stages": [off_stage]}
    if not gpu:  # every pipeline's stage 0 shares core 0 anyway; the talker gets core 1
        for cfg in (on, off):
            cfg["stages"][0]["cpu_cores"] = "0"
    return {"off": parse_config(off), "on": parse_config(on), "chain": parse_config(chain)}


async def one_round(endpoint: str, requests: int, tokens: int, stages: list[int]) -> tuple[float, int]:
    sampling = {s: SamplingParamsMsg(max_tokens=tokens, ignore_eos=True) for s in stages}
    async with AsyncOmniClient(endpoint) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(
                client.generate(f"request {i}: tell me a story", sampling=sampling, timeout_s=600)
                for i in range(requests)
            )
        )
        wall = time.perf_counter() - t0
    stage0 = sum(len(o.token_ids) for r in results for o in r.outputs if o.stage_id == 0)
    return wall, stage0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gpu", action="store_true", help="use the GPU configs (stages on GPU 0 and 1)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--model", help="model of both stages (default: the config's tiny ones), e.g. small-qwen2")
    args = p.parse_args()
    cfgs = configs(args.gpu, args.model)
    coords: dict[str, Coordinator] = {}
    threads: list[threading.Thread] = []
    try:
        for name, cfg in cfgs.items():
            print(f"[bench] starting pipeline {name!r} ...", flush=True)
            c = Coordinator(cfg, progress=lambda m: None)
            coords[name] = c
            c.start()
            t = threading.Thread(target=c.run, daemon=True)
            t.start()
            threads.append(t)
        # Warm-up round each (first-use allocations), then alternating measured rounds.
        walls: dict[str, list[float]] = {n: [] for n in cfgs}
        toks: dict[str, int] = {}
        for r in range(args.rounds + 1):
            for name, c in coords.items():
                stages = [s.id for s in cfgs[name].stages]
                wall, n0 = asyncio.run(one_round(c.client_endpoint, args.requests, args.tokens, stages))
                if r > 0:
                    walls[name].append(wall)
                    toks[name] = n0
                print(f"[bench] round {r}{' (warm-up)' if r == 0 else ''} {name}: {wall:.3f}s", flush=True)
    finally:
        for c in coords.values():
            c.stop()
        for t in threads:
            t.join()
    med = {n: statistics.median(w) for n, w in walls.items()}
    model = args.model or "tiny-qwen2 / tiny-qwen2-b"
    print(f"\n{model}, {args.requests} concurrent requests x {args.tokens} tokens, median of {args.rounds} rounds")
    print(f"{'pipeline':<8} {'wall s':>8} {'stage-0 tok/s':>14}")
    for n in cfgs:
        print(f"{n:<8} {med[n]:>8.3f} {toks[n] / med[n]:>14.1f}")
    overhead = med["on"] / med["off"] - 1
    print(
        f"\nhidden-state output on vs off: {med['off'] / med['on']:.3f}x throughput "
        f"({100 * overhead:+.1f}% time; target <= +10%)"
    )
    print(f"thinker->talker end to end vs stage 0 alone (hidden on): {med['chain'] / med['on']:.2f}x the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())

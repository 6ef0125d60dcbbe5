"""Stage replicas past two GPUs, on a CPU: the router's cost per request and what the
all-to-all links cost, at 1 to 64 replicas a stage (docs/replicas.md).

Measured here, on this host:
  router    `Router.bind` + `release` per request (omni_mp.control.router), for a chain of
            three stages whose two downstream stages have R replicas each, every replica
            serving and linked (the router's worst case: it scores every replica), and with
            a quarter of them down; the median over many requests.
  messages  the encoded size of what grows with the replica count: the Connect a new
            replica gets (an endpoint per downstream replica), the StatusReply (one entry
            per process), a StageRequest with its bound replicas.
  links     one same-host link's set-up, as a stage makes it on Connect: a ZMQ PUSH socket
            and its shared-memory pool created and prefaulted (the default 256 MiB, or
            --pool-mib), timed and its resident size read.
Modelled from those: per layout (R upstream x R downstream replicas), the link count, the
shared memory all pools pin, and the set-up time one upstream replica spends on Connect.

    python benchmarks/replica_scaling.py [--replicas 1 2 8 64] [--requests 20000] [--pool-mib 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import zmq

from omni_mp.config.validate import parse_config
from omni_mp.control.router import ReplicaKey, Router
from omni_mp.wire.codec import encode
from omni_mp.wire.messages import (
    BoundReplica,
    Connect,
    StageEndpoint,
    StageRequest,
    StageStats,
    StageStatus,
    StatusReply,
)
from omni_mp.wire.shm_pool import ShmPoolConfig
from omni_mp.wire.transport import MessageReceiver, MessageSender


def chain(replicas: int) -> Any:
    stage = {"model": "tiny-qwen2-b", "processor": "continue_tokens"}
    return parse_config(
        {
            "name": "scale",
            "stages": [
                {"id": 0, "model": "tiny-qwen2"},
                {"id": 1, "inputs": [0], "replicas": replicas, **stage},
                {"id": 2, "inputs": [1], "replicas": replicas, "final_output": True, **stage},
            ],
        },
        check_engine_args=False,
    )


def router_cost(replicas: int, requests: int, down_share: float) -> dict[str, float]:
    """Microseconds per request to bind it (and release it at every stage)."""
    cfg = chain(replicas)
    down = {ReplicaKey(s, r) for s in (1, 2) for r in range(int(replicas * down_share))}
    load = {ReplicaKey(s, r): (r * 7) % 5 for s in (1, 2) for r in range(replicas)}
    router = Router(cfg, lambda k: k not in down, lambda u, d: True, lambda k: load.get(k, 0))
    inflight: list[dict[int, int]] = []
    samples = []
    for _ in range(requests):
        t0 = time.perf_counter_ns()
        route = router.bind()
        inflight.append(route)
        if len(inflight) > 64:  # a steady state of 64 requests in flight
            for sid, r in inflight.pop(0).items():
                router.release(ReplicaKey(sid, r))
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return {"p50_us": samples[len(samples) // 2] / 1e3, "p99_us": samples[int(len(samples) * 0.99)] / 1e3}


def message_bytes(replicas: int) -> dict[str, int]:
    endpoints = [
        StageEndpoint(stage_id=2, endpoint=f"tcp://10.0.0.{r % 250}:{40000 + r}", replica=r) for r in range(replicas)
    ]
    connect = sum(len(bytes(f)) for f in encode(Connect(downstream=endpoints)))
    stats = StageStats(running=12, waiting=3, steps=123456, step_seconds=4567.8)
    procs = 1 + 2 * replicas
    status = StatusReply(
        pipeline="scale",
        inflight=64,
        stages=[StageStatus(stage_id=1, replica=i % 64, pid=10_000 + i, alive=True, ready=True, restarts=0, stats=stats)
                for i in range(procs)],
    )  # fmt: skip
    request = StageRequest(request_id="q123456", stage_id=1, downstream_replicas=[BoundReplica(2, replicas - 1)])
    return {
        "connect": connect,
        "status": sum(len(bytes(f)) for f in encode(status)),
        "stage_request": sum(len(bytes(f)) for f in encode(request)),
    }


def link_setup(pool_mib: int, rounds: int = 3) -> dict[str, float]:
    """One same-host link as a stage opens it on Connect: socket + shm pool (prefaulted)."""
    ctx = zmq.Context()
    receiver = MessageReceiver(ctx, "ipc://@omni-replica-scaling-bench", hwm=64)
    times = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            sender = MessageSender(
                ctx, "ipc://@omni-replica-scaling-bench", shm=ShmPoolConfig(capacity_bytes=pool_mib * 2**20)
            )
            times.append(time.perf_counter() - t0)
            sender.close()
    finally:
        receiver.close()
        ctx.term()
    return {"seconds": statistics.median(times), "pool_mib": pool_mib}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 8, 64])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--pool-mib", type=int, default=ShmPoolConfig().capacity_bytes // 2**20)
    args = p.parse_args()
    link = link_setup(args.pool_mib)
    print(f"one link (ipc socket + {args.pool_mib} MiB shm pool, prefaulted): {link['seconds'] * 1e3:.1f} ms to open")
    rows = []
    for r in args.replicas:
        all_up = router_cost(r, args.requests, 0.0)
        some_down = router_cost(r, args.requests, 0.25)
        sizes = message_bytes(r)
        links = r + r * r  # stage 0 -> R replicas of stage 1, R x R from stage 1 to stage 2
        per_link_mib = max(args.pool_mib / r, min(args.pool_mib, 16))  # omni_mp.stage.loop.link_pools
        row = {
            "replicas": r,
            "router_p50_us": round(all_up["p50_us"], 2),
            "router_p99_us": round(all_up["p99_us"], 2),
            "router_p50_us_quarter_down": round(some_down["p50_us"], 2),
            "links": links,
            "shm_pinned_gib_full_pools": round(links * args.pool_mib / 1024, 1),
            # omni_mp.stage.loop.link_pools: a link to one of R replicas gets 1/R of the pool
            "shm_pinned_gib": round(links * per_link_mib / 1024, 1),
            # a pool's set-up is its prefault, in proportion to its size (link_pools: 1/R of it each)
            "connect_s_per_upstream_replica": round(r * link["seconds"] * per_link_mib / args.pool_mib, 2),
            **{f"{k}_bytes": v for k, v in sizes.items()},
        }
        rows.append(row)
        print(json.dumps(row))


if __name__ == "__main__":
    main()

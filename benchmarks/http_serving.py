"""The OpenAI-compatible HTTP server against the ZMQ client on the same pipeline.

One launcher with `--http` serves both. For each concurrency (1, 8, 32 by default), rounds
alternate between the two ways in: `c` concurrent spoken chat requests (the same prompts,
voices and seeds), streamed. Prints, side by side, time to first audio (p50 and p90 over
every request of the rounds) and throughput (requests/s); the HTTP server's added latency
to first audio (target <= 5 ms p50) and its throughput ratio (target >= 0.95x), and the cores the
clients kept busy (a load generator near one core measures itself: spread the HTTP clients over
processes with --http-clients). Each level is
warmed up first (one unmeasured round each way at that level: benchmarks.common.warmup), which
the last line says; --out writes the numbers and the warm-up record as JSON.

    python -m benchmarks.http_serving [--config omni_mp/stage_configs/tiny_qwen2_5_omni.yaml]
        [--concurrency 1,8,32] [--rounds 3] [--tokens 48] [--http-clients 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common.served import measure_served, released_qwen3_omni, write_result
from benchmarks.common.stats import percentile_inclusive as _pct
from benchmarks.common.warmup import Warmups
from omni_mp.client.omni_client import AsyncOmniClient
from omni_mp.config.validate import load_config
from omni_mp.http.pipeline import PipelineView, Sampling, voices_of
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import StageOutputChunk

Request = tuple[str, str, int]  # prompt, voice, seed


async def via_zmq(client: AsyncOmniClient, view: PipelineView, req: Request, tokens: int) -> float:
    """Seconds from submission to the first audio chunk; the stream is read to its end."""
    prompt, voice, seed = req
    assert view.audio_stage is not None
    sampling = view.sampling(Sampling(max_tokens=tokens, seed=seed), audio=True)  # as the server maps it
    t0, first = time.perf_counter(), None
    async for ev in client.stream(prompt, speaker=voice, sampling=sampling):
        if first is None and isinstance(ev, StageOutputChunk) and ev.stage_id == view.audio_stage.id:
            if ev.additional_information and "audio" in ev.additional_information:
                first = time.perf_counter() - t0
    assert first is not None
    return first


async def via_http(http: httpx.AsyncClient, url: str, req: Request, tokens: int) -> float:
    prompt, voice, seed = req
    body = {
        "model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True, "seed": seed,
        "modalities": ["text", "audio"], "audio": {"voice": voice, "format": "pcm16"}, "max_completion_tokens": tokens,
    }  # fmt: skip
    t0, first = time.perf_counter(), None
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {") and '"audio"' in line:
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("audio", {}).get("data"):
                    base64.b64decode(delta["audio"]["data"])  # what a player would do
                    first = time.perf_counter() - t0
    assert first is not None
    return first


Round = tuple[list[float], float, float]  # each request's first audio (s), the wall (s), client CPU (s)


async def one_round(run: Callable[[Request], Awaitable[float]], reqs: list[Request]) -> Round:
    t0, cpu = time.perf_counter(), time.process_time()
    firsts = await asyncio.gather(*(run(r) for r in reqs))
    return list(firsts), time.perf_counter() - t0, time.process_time() - cpu


def _http_share(url: str, reqs: list[Request], tokens: int, start_at: float) -> tuple[list[float], float, float]:
    """One client process's share of an HTTP round (--http-clients): its requests at once from
    `start_at` (time.time(), the round's common start); (first audio s, end time, CPU s)."""

    async def share() -> list[float]:
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as http:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            return list(await asyncio.gather(*(via_http(http, url, r, tokens) for r in reqs)))

    cpu = time.process_time()
    firsts = asyncio.run(share())
    return firsts, time.time(), time.process_time() - cpu


class SpreadHttp:
    """HTTP rounds from `n` client processes (the load generator spread over cores, as clients on
    other machines would be), the requests dealt round-robin; the round's wall is its common
    start to its last stream's end."""

    def __init__(self, n: int, url: str, tokens: int) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
        self.n, self.url, self.tokens = n, url, tokens

    async def round(self, reqs: list[Request]) -> Round:
        loop = asyncio.get_running_loop()
        start_at = time.time() + 0.5  # every process has its loop up by then
        shares = [reqs[k :: self.n] for k in range(self.n)]
        jobs = [loop.run_in_executor(self.pool, _http_share, self.url, s, self.tokens, start_at) for s in shares if s]
        done = await asyncio.gather(*jobs)
        firsts = [f for share, _, _ in done for f in share]
        return firsts, max(end for _, end, _ in done) - start_at, sum(cpu for _, _, cpu in done)


WARMUP = "one unmeasured round each way (ZMQ, then HTTP) at each level's concurrency, just before its measured rounds"


async def bench(args: argparse.Namespace, url: str, endpoint: str, view: PipelineView) -> dict[str, Any]:
    """Per level: its warm-up rounds, then --rounds measured rounds alternating who goes first;
    prints a row per level and returns the levels and the warm-up record."""
    warmups = Warmups(WARMUP)
    levels: dict[str, Any] = {}
    print(f"{'conc':>4} | {'TTFA p50 zmq':>12} {'http':>8} {'added':>8} | {'p90 zmq':>8} {'http':>8} | "
          f"{'req/s zmq':>9} {'http':>8} {'ratio':>6} | {'CPU zmq':>7} {'http':>4}")  # fmt: skip
    async with (
        AsyncOmniClient(endpoint) as client,
        httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as http,
    ):
        ways: dict[str, Callable[[list[Request]], Awaitable[Round]]] = {
            "zmq": lambda reqs: one_round(lambda r: via_zmq(client, view, r, args.tokens), reqs),
            "http": lambda reqs: one_round(lambda r: via_http(http, url, r, args.tokens), reqs),
        }
        if args.http_clients > 1:
            spread = SpreadHttp(args.http_clients, url, args.tokens)
            ways["http"] = spread.round
        voices = voices_of(await client.status())[:2]  # the pipeline's own voice names
        for c in args.concurrency:
            t0 = time.time()
            warm = [(f"Warm up number {i}.", voices[i % len(voices)], 1_000_000 + i) for i in range(c)]
            for way in ("zmq", "http"):
                await ways[way](warm)
            warmups.warmed(c, t0, 2 * c)
            levels[str(c)] = await measured_level(ways, c, args.rounds, warmups, voices)
    return {"levels": levels, "warmup": warmups.to_json()}


async def measured_level(
    ways: dict[str, Callable[[list[Request]], Awaitable[Round]]],
    c: int,
    rounds: int,
    warmups: Warmups,
    voices: list[str],
) -> dict[str, Any]:
    """One level's measured rounds (alternating who goes first), its printed row and its numbers."""
    stats: dict[str, tuple[list[float], float, int]] = {"zmq": ([], 0.0, 0), "http": ([], 0.0, 0)}
    busy = {"zmq": 0.0, "http": 0.0}  # the clients' CPU seconds in each way's rounds
    for rnd in range(rounds):
        t_round = time.time()
        reqs = [(f"Tell me about the number {i}.", voices[i % len(voices)], 1000 * rnd + i) for i in range(c)]
        order = ("zmq", "http") if rnd % 2 == 0 else ("http", "zmq")  # alternate who goes first
        for way in order:
            firsts, wall, cpu = await ways[way](reqs)
            f, w, n = stats[way]
            stats[way] = (f + firsts, w + wall, n + len(reqs))
            busy[way] += cpu
        warmups.measured(c, t_round)
    (fz, wz, nz), (fh, wh, nh) = stats["zmq"], stats["http"]
    p50z, p50h = 1000 * statistics.median(fz), 1000 * statistics.median(fh)
    tz, th = nz / wz, nh / wh
    cpu_z, cpu_h = busy["zmq"] / wz, busy["http"] / wh  # cores the clients kept busy
    print(
        f"{c:>4} | {p50z:>10.1f}ms {p50h:>6.1f}ms {p50h - p50z:>+6.1f}ms | "
        f"{1000 * _pct(fz, 90):>6.1f}ms {1000 * _pct(fh, 90):>6.1f}ms | {tz:>9.2f} {th:>8.2f} {th / tz:>5.2f}x | "
        f"{cpu_z:>4.0%} {cpu_h:>4.0%}",
        flush=True,
    )
    return {
        "first_audio_p50_ms": {"zmq": p50z, "http": p50h},
        "first_audio_p90_ms": {"zmq": 1000 * _pct(fz, 90), "http": 1000 * _pct(fh, 90)},
        "requests_per_s": {"zmq": tz, "http": th},
        "client_cores_busy": {"zmq": cpu_z, "http": cpu_h},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG_DIR / "tiny_qwen2_5_omni.yaml")
    p.add_argument("--concurrency", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48, help="thinker tokens per request")
    p.add_argument("--out", type=Path, help="also write the levels and the warm-up record to this JSON file")
    released = "instead of --config: the shipped qwen3_omni.yaml on the released-size checkpoint (GPU)"
    p.add_argument("--released", action="store_true", help=released)
    p.add_argument("--frames", type=int, default=64, help="--released: codec frames per spoken answer")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "qwen3_omni_gpu")
    serving = "measure this running pipeline (its HTTP URL and ZMQ endpoint; --config: its config)"
    p.add_argument("--serving", nargs=2, metavar=("URL", "ENDPOINT"), help=serving)
    clients = "HTTP requests from this many client processes (1: this one, beside the ZMQ client)"
    p.add_argument("--http-clients", type=int, default=1, help=clients)
    args = p.parse_args()
    if args.released:
        args.config = released_qwen3_omni(args.work_dir, args.tokens, args.frames)
    view = PipelineView.of(load_config(args.config))
    serving = None if args.serving is None else (args.serving[0], args.serving[1])
    result = measure_served(args.config, serving, lambda url, endpoint: bench(args, url, endpoint, view))
    write_result(args.out, args.config, args.tokens, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

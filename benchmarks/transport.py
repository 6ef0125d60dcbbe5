"""Transport benchmark: omni_mp links against pickle+multiprocessing.Queue, raw pyzmq and memcpy.

Two processes (spawn): this one sends, a child receives. Payload: PromptEmbeds of
[N, 3584] bfloat16 (a Qwen2.5-7B-sized hidden state for N tokens), 4 KiB to 64 MiB.

What is timed, per path and size:
  latency     one message at a time (the next is sent after the receiver acknowledged):
              from before encode on the sender to after decode on the receiver, i.e.
              encode -> send -> recv -> decode, one way. Both sides read CLOCK_MONOTONIC
              (time.monotonic_ns), which is one clock for all processes of a host, so this
              is a true one-way time, not round trip / 2.
  throughput  a stream of messages sent back to back (bounded by ZMQ HWM, queue or pool
              credits): bytes / (last decode done - first send start). The receiver acks
              only when it has caught up, so acks cost a stream almost nothing.
All paths stay open and each round runs every size on every path in turn (3 rounds, 1
with --quick): the host is shared, and interleaving spreads its noise over all paths.
The receiver ends with a usable tensor (a zero-copy view for omni_mp paths) and then drops
it; with shared memory that returns the region to the sender. Nothing copies the data out
of the pool, because the design does not require it: consumers use the view.
Baselines: (a) pickle.dumps of the same dict into a multiprocessing.Queue, pickle.loads on
the other side; (b) raw pyzmq zero-copy send of the same bytes over ipc, no codec; (c) one
in-process torch copy_ of the same bytes (the memcpy limit), into successive slices of a
buffer as large as the pool, like the pool's ring ("memcpy"; the ratios use it), and into
one reused buffer ("memcpy (hot)": cache-resident up to a few MiB, shown for reference).
torch runs single-threaded in every process, so the copies compared are all single-core.
Small-message round trip: a Heartbeat there and back over two ipc links (codec included),
next to raw pyzmq doing the same with 16 bytes.

The shm path uses a 512 MiB pool (room for several 64 MiB messages in flight) and the
default threshold (64 KiB): below it that link sends frames too.

Usage: python -m benchmarks.transport [--quick] [--json FILE] [--rounds N] [--paths ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pickle
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import zmq

from omni_mp.wire.codec import PayloadError
from omni_mp.wire.messages import Heartbeat, PromptEmbeds, Shutdown, StageOutputChunk
from omni_mp.wire.shm_pool import ShmPoolConfig
from omni_mp.wire.transport import MessageReceiver, MessageSender, make_socket

HIDDEN = 3584
MIB = 2**20
# (label, shape); every shape is bf16
PAYLOADS: list[tuple[str, tuple[int, int]]] = [
    ("4 KiB", (1, 2048)),
    ("112 KiB", (16, HIDDEN)),
    ("1 MiB", (147, HIDDEN)),
    ("8 MiB", (1171, HIDDEN)),
    ("64 MiB", (9363, HIDDEN)),
]
PATHS = ["shm", "ipc frames", "tcp frames", "raw pyzmq ipc", "raw pyzmq tcp", "pickle+mp.Queue"]
TCP_PATHS = ("tcp frames", "raw pyzmq tcp")
CODEC_PATHS = ("shm", "ipc frames", "tcp frames")
# Ack from the receiver: how many messages it decoded since its last ack, and when it
# finished the last of them (ns). It acks whenever it has caught up, so a stream costs few
# acks and a single message gets one at once.
ACK = struct.Struct("<qq")
STOP = b""  # end of stream on the raw and pickle paths


def counts(nbytes: int, quick: bool) -> tuple[int, int]:
    """(latency samples, stream length) per round for a payload size: ~constant time each."""
    lat = max(8, min(300, 100 * MIB // max(nbytes, 1)))
    stream = max(8, min(1000, 256 * MIB // max(nbytes, 1)))
    return (max(4, lat // 4), max(4, stream // 4)) if quick else (lat, stream)


# ---- receiver (child process) -------------------------------------------------------------


def _receiver(path: str, endpoint: str, ack_endpoint: str, queue: Any) -> None:
    torch.set_num_threads(1)
    ctx = zmq.Context()
    ack = make_socket(ctx, zmq.PUSH, hwm=100_000)
    ack.connect(ack_endpoint)
    recv: Callable[[], Any]
    pending: Callable[[], bool]
    if path.startswith("raw pyzmq"):
        sock = make_socket(ctx, zmq.PULL, hwm=64)
        sock.bind(endpoint)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)

        def recv() -> Any:
            frame = sock.recv(copy=False)
            return frame if len(frame) else None

        def pending() -> bool:
            return bool(sock.poll(0))
    elif path == "pickle+mp.Queue":

        def recv() -> Any:
            data = queue.get()
            return pickle.loads(data)["prompt_embeds"] if data else None

        def pending() -> bool:
            return not queue.empty()
    else:
        receiver = MessageReceiver(ctx, endpoint)
        endpoint = receiver.socket.getsockopt_string(zmq.LAST_ENDPOINT)

        def recv() -> Any:
            msg = receiver.recv()
            return None if isinstance(msg, Shutdown) else msg.prompt_embeds.data

        def pending() -> bool:
            return bool(receiver.socket.poll(0))

    ack.send(endpoint.encode())  # ready, and where to connect
    decoded = 0
    while (data := recv()) is not None:
        done = time.monotonic_ns()
        del data  # the consumer is done: a shared-memory region goes back to the sender
        decoded += 1
        if not pending():
            ack.send(ACK.pack(decoded, done))
            decoded = 0
    ctx.destroy(linger=0)


# ---- sender (this process) ----------------------------------------------------------------


class Link:
    """Sending side of one path, plus the ack socket that paces and timestamps it."""

    def __init__(self, path: str, tmp: str, mp_ctx: Any, shm: ShmPoolConfig) -> None:
        self.path = path
        self.ctx = zmq.Context()
        self.ack = make_socket(self.ctx, zmq.PULL, hwm=100_000)
        name = path.replace(" ", "_").replace("+", "_")
        ack_ep = f"ipc://{tmp}/{name}-ack"
        self.ack.bind(ack_ep)
        endpoint = "tcp://127.0.0.1:*" if path in TCP_PATHS else f"ipc://{tmp}/{name}-data"
        self.queue = mp_ctx.Queue() if path == "pickle+mp.Queue" else None
        self.proc = mp_ctx.Process(target=_receiver, args=(path, endpoint, ack_ep, self.queue), daemon=True)
        self.proc.start()
        endpoint = self.ack.recv().decode()
        self.send: Callable[[torch.Tensor], None]
        if path.startswith("raw pyzmq"):
            self.sock = make_socket(self.ctx, zmq.PUSH, hwm=64)
            self.sock.connect(endpoint)
            self.send = lambda t: self.sock.send(t.reshape(-1).view(torch.uint8).numpy(), copy=False)
            self._stop = lambda: self.sock.send(STOP)  # an empty frame
        elif path == "pickle+mp.Queue":
            self.send = lambda t: self.queue.put(pickle.dumps({"request_id": "r", "prompt_embeds": t}, protocol=5))
            self._stop = lambda: self.queue.put(STOP)
        else:
            self.sender = MessageSender(self.ctx, endpoint, shm=shm if path == "shm" else None)
            self.send = lambda t: self.sender.send(
                StageOutputChunk(request_id="r", stage_id=0, prompt_embeds=PromptEmbeds(t))
            )
            self._stop = lambda: self.sender.send(Shutdown(reason="done"))

    def wait_acks(self, n: int) -> int:
        """Wait until the receiver has decoded n more messages; when it finished the last."""
        last = 0
        while n > 0:
            decoded, last = ACK.unpack(self.ack.recv())
            n -= decoded
        return last

    def latency_us(self, t: torch.Tensor, n: int) -> list[float]:
        out = []
        for _ in range(n):
            start = time.monotonic_ns()
            self.send(t)
            out.append((self.wait_acks(1) - start) / 1e3)
        return out

    def throughput_gbs(self, t: torch.Tensor, n: int) -> float:
        start = time.monotonic_ns()
        for _ in range(n):
            self.send(t)
        return n * t.numel() * t.element_size() / (self.wait_acks(n) - start)  # bytes/ns = GB/s

    def close(self) -> None:
        self._stop()
        self.proc.join(timeout=30)
        if self.path in CODEC_PATHS:
            self.sender.close()
        self.ctx.destroy(linger=0)


def memcpy(t: torch.Tensor, n: int, arena: torch.Tensor | None) -> tuple[list[float], float]:
    """Time one torch copy_ of t's bytes. With `arena`, each copy goes to the next slice of
    it, as the pool's ring does (so sizes above the cache are not flattered by a hot
    destination); without, the same destination every time (the cache-hot limit)."""
    src = t.reshape(-1).view(torch.uint8)
    nbytes = src.numel()
    if arena is None:
        dsts = [torch.empty(nbytes, dtype=torch.uint8)]
    else:
        dsts = [arena[i * nbytes : (i + 1) * nbytes] for i in range(min(n, arena.numel() // nbytes))]
    for dst in dsts:
        dst.copy_(src)  # fault the pages in
    times = []
    for i in range(n):
        start = time.monotonic_ns()
        dsts[i % len(dsts)].copy_(src)
        times.append((time.monotonic_ns() - start) / 1e3)
    return times, nbytes / (statistics.median(times) * 1e3)


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def small_round_trip(tmp: str, mp_ctx: Any, n: int) -> dict[str, float]:
    """p50 round trip of a Heartbeat (codec) and of 16 raw bytes (pyzmq), over ipc."""
    proc = mp_ctx.Process(target=_echo, args=(tmp,), daemon=True)
    proc.start()
    ctx = zmq.Context()
    out: dict[str, float] = {}
    back = MessageReceiver(ctx, f"ipc://{tmp}/back")
    there = MessageSender(ctx, f"ipc://{tmp}/there")
    beat = Heartbeat(stage_id=0, seq=0, time=0.0)
    for _ in range(20):  # warm up and wait for the connection
        there.send(beat)
        back.recv(timeout=30)
    times = []
    for i in range(n):
        start = time.perf_counter_ns()
        there.send(Heartbeat(stage_id=0, seq=i, time=time.time()))
        back.recv()
        times.append((time.perf_counter_ns() - start) / 1e3)
    out["codec"] = statistics.median(times)
    raw_times = []
    for _ in range(n + 20):
        start = time.perf_counter_ns()
        there.socket.send(b"x" * 16)
        back.socket.recv()
        raw_times.append((time.perf_counter_ns() - start) / 1e3)
    out["raw"] = statistics.median(raw_times[20:])
    there.send(Shutdown())
    proc.join(timeout=30)
    there.close()
    back.close()
    ctx.destroy(linger=0)
    return out


def _echo(tmp: str) -> None:
    ctx = zmq.Context()
    inbox = MessageReceiver(ctx, f"ipc://{tmp}/there")
    outbox = MessageSender(ctx, f"ipc://{tmp}/back")
    while True:  # codec phase: echo messages; raw phase: echo raw frames
        try:
            msg = inbox.recv()
        except PayloadError:  # a raw 16-byte frame is not a message
            outbox.socket.send(b"y" * 16)
            continue
        if isinstance(msg, Shutdown):
            break
        outbox.send(msg)
    outbox.close()
    inbox.close()
    ctx.destroy(linger=0)


# ---- report -------------------------------------------------------------------------------


def run(quick: bool, shm: ShmPoolConfig, paths: list[str], rounds: int) -> dict[str, Any]:
    """All links are open at once and every round measures every size on every path in
    turn, so load from elsewhere on the host spreads over the paths instead of landing on
    one. Latency samples pool over rounds; throughput is the median of the rounds."""
    torch.set_num_threads(1)
    mp_ctx = mp.get_context("spawn")
    tensors = {label: torch.randn(shape).to(torch.bfloat16) for label, shape in PAYLOADS}
    arena = torch.empty(shm.capacity_bytes, dtype=torch.uint8)  # the pool's footprint
    lat: dict[tuple[str, str], list[float]] = {}
    gbs: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="omni_bench") as tmp:
        links = {path: Link(path, tmp, mp_ctx, shm) for path in paths}
        for rnd in range(rounds):
            for label, t in tensors.items():
                lat_n, stream_n = counts(t.numel() * t.element_size(), quick)
                print(
                    f"[bench] round {rnd + 1}/{rounds} {label:8s} latency x{lat_n}, stream x{stream_n}",
                    file=sys.stderr,
                    flush=True,
                )
                for path, use_arena in (("memcpy", True), ("memcpy (hot)", False)):
                    times, rate = memcpy(t, max(lat_n, 20), arena if use_arena else None)
                    lat.setdefault((label, path), []).extend(times)
                    gbs.setdefault((label, path), []).append(rate)
                for path, link in links.items():
                    link.latency_us(t, 3)  # warm-up
                    lat.setdefault((label, path), []).extend(link.latency_us(t, lat_n))
                    gbs.setdefault((label, path), []).append(link.throughput_gbs(t, stream_n))
        for link in links.values():
            link.close()
        print("[bench] small-message round trip", file=sys.stderr, flush=True)
        small = small_round_trip(tmp, mp_ctx, 300 if quick else 2000)
    rows = [
        {"size": label, "path": path, "gbs": statistics.median(gbs[label, path]), "p50": p(xs, 50), "p99": p(xs, 99)}
        for (label, path), xs in lat.items()
    ]
    return {"rows": rows, "small": small, "rounds": rounds, "quick": quick}


RATIOS = [  # (numerator, denominator, heading with the target)
    ("shm", "memcpy", "shm / memcpy [>=0.5 at >=1 MiB]"),
    ("shm", "pickle+mp.Queue", "shm / pickle+Queue [>=5]"),
    ("ipc frames", "raw pyzmq ipc", "ipc frames / raw pyzmq ipc [>=0.8]"),
    ("tcp frames", "raw pyzmq tcp", "tcp frames / raw pyzmq tcp [>=0.8]"),
]


def report(results: dict[str, Any]) -> str:
    rows = {(r["size"], r["path"]): r for r in results["rows"]}
    paths = [path for path in ["memcpy", "memcpy (hot)", *PATHS] if (PAYLOADS[0][0], path) in rows]
    lines = ["| payload | " + " | ".join(paths) + " |", "|---" * (len(paths) + 1) + "|"]
    for label, _ in PAYLOADS:
        cells = [
            f"{rows[label, path]['gbs']:.2f} GB/s<br>{rows[label, path]['p50']:.0f} / {rows[label, path]['p99']:.0f} us"
            for path in paths
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    ratios = [(a, b, heading) for a, b, heading in RATIOS if a in paths and b in paths]
    lines += ["", "Ratios of throughput (target in brackets):", ""]
    lines += ["| payload | " + " | ".join(h for _, _, h in ratios) + " |", "|---" * (len(ratios) + 1) + "|"]
    for label, _ in PAYLOADS:
        lines.append(
            f"| {label} | "
            + " | ".join(f"{rows[label, a]['gbs'] / rows[label, b]['gbs']:.2f}" for a, b, _ in ratios)
            + " |"
        )
    small = results["small"]
    lines += [
        "",
        f"Small-message round trip p50 (ipc): {small['codec']:.0f} us with the codec, "
        f"{small['raw']:.0f} us raw pyzmq [target <= 100 us]",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (~1/5), for a smoke run")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--shm-threshold", type=int, default=ShmPoolConfig().threshold_bytes,
                        help="smallest tensor (bytes) sent through the pool")  # fmt: skip
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=PATHS, help="run only these paths")
    parser.add_argument("--rounds", type=int, help="rounds over all paths and sizes (default 3, quick 1)")
    args = parser.parse_args()
    shm = ShmPoolConfig(capacity_bytes=512 * MIB, threshold_bytes=args.shm_threshold)
    results = run(args.quick, shm, args.paths, args.rounds or (1 if args.quick else 3))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("Cells: throughput, then one-way latency p50 / p99.")
    print(report(results))


if __name__ == "__main__":
    main()

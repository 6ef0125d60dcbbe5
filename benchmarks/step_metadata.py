"""Thinker -> talker per-step metadata on the CPU: what one thinker decode step at N concurrent
requests costs the sending and receiving stage in Python, split like the stage timelines
(issue 20: 2.5-2.9 ms per step at 64 requests on an H200 host; target <= 0.3 ms).

Per step: N `StageOutputChunk`s of one new token and one hidden row ([1, 3584] bf16, a 7B
thinker's width) are built (what `StageLoop._step` does), packed (`StageOutputBatch.pack`:
one row buffer, the chunks as columns), encoded (`codec.encode`: validation + msgpack +
tensor headers), decoded (`codec.decode`) and unpacked (`StageOutputBatch.unpacked`: views
per chunk). A thinker is also a final stage: "events" is the copy of the step for the
coordinator, tokens only (no request asked for rows: `pack(chunks, rows_for=())`), packed
and encoded. No sockets:
the bytes on the wire are one small body and one row buffer, whatever N.

    python -m benchmarks.step_metadata [--requests 1,8,32,64] [--width 3584] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from omni_mp.wire.codec import decode, encode
from omni_mp.wire.messages import HiddenRows, StageOutputBatch, StageOutputChunk


def one_step(n: int, rows: torch.Tensor, step: int) -> dict[str, float]:
    t0 = time.perf_counter()
    chunks = [
        StageOutputChunk(
            request_id=f"req-{i:04d}",
            stage_id=0,
            token_ids=[1000 + step],
            hidden=HiddenRows(start=64 + step, last=rows[i : i + 1]),
        )
        for i in range(n)
    ]
    t1 = time.perf_counter()
    batch = StageOutputBatch.pack(chunks)
    t2 = time.perf_counter()
    frames = encode(batch)
    t3 = time.perf_counter()
    got = decode(frames)
    t4 = time.perf_counter()
    assert isinstance(got, StageOutputBatch)
    out = got.unpacked()
    t5 = time.perf_counter()
    assert len(out) == n and out[-1].hidden is not None and out[-1].hidden.last is not None
    events = encode(StageOutputBatch.pack(chunks, rows_for=()))
    t6 = time.perf_counter()
    assert len(events) == 1  # no tensors
    return {
        "build": t1 - t0,
        "pack": t2 - t1,
        "encode": t3 - t2,
        "decode": t4 - t3,
        "unpack": t5 - t4,
        "events": t6 - t5,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="1,8,32,64")
    ap.add_argument("--width", type=int, default=3584)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# per step, median of {args.steps} steps (microseconds); hidden width {args.width} bf16")
    print("| requests | build | pack | encode | events | sender total | decode | unpack | receiver total |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.requests.split(",")):
        rows = torch.randn(n, args.width).to(torch.bfloat16)
        for s in range(20):
            one_step(n, rows, s)
        runs = [one_step(n, rows, s) for s in range(args.steps)]
        med = {k: 1e6 * statistics.median(r[k] for r in runs) for k in runs[0]}
        send = med["build"] + med["pack"] + med["encode"] + med["events"]
        recv = med["decode"] + med["unpack"]
        print(
            f"| {n} | {med['build']:.0f} | {med['pack']:.0f} | {med['encode']:.0f} | {med['events']:.0f} | {send:.0f} "
            f"| {med['decode']:.0f} | {med['unpack']:.0f} | {recv:.0f} |"
        )


if __name__ == "__main__":
    main()

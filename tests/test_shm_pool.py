"""Shared-memory pool: allocator, credits, descriptor validation, and crashes of either side."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_mp.wire.codec import PayloadError, decode_with_regions, encode
from omni_mp.wire.messages import PromptEmbeds, StageOutputChunk
from omni_mp.wire.shm_pool import ALIGN, ShmPool, ShmPoolConfig, ShmReader, ShmRef
from omni_mp.wire.transport import MessageReceiver, MessageSender

REPO = Path(__file__).resolve().parents[1]
KIB = 1024


def pattern(nbytes: int, seed: int) -> torch.Tensor:
    return (torch.arange(nbytes, dtype=torch.int64) * 7 + seed).to(torch.uint8)


def our_mappings() -> list[str]:
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if "omni_mp-pool" in line]


@pytest.fixture
def pool() -> Iterator[ShmPool]:
    with ShmPool(ShmPoolConfig(capacity_bytes=64 * KIB, num_slots=8, threshold_bytes=1)) as p:
        yield p


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 24 * KIB), st.integers(0, 7)), min_size=1, max_size=40))
def test_ring_allocator_never_overlaps_live_regions(ops: list[tuple[int, int]]) -> None:
    """Random sizes and release orders: every region still held keeps its bytes, and an
    empty pool always takes a buffer that fits."""
    reader = ShmReader()
    held: list[tuple[torch.Tensor, torch.Tensor]] = []  # (view in the pool, expected bytes)
    with ShmPool(ShmPoolConfig(capacity_bytes=64 * KIB, num_slots=8, threshold_bytes=1)) as pool:
        for seed, (nbytes, release) in enumerate(ops):
            if held and release < 4:  # release one region, in any order
                held.pop(release % len(held))
            src = pattern(nbytes, seed)
            try:
                ref = pool.put(src, timeout=0)
            except TimeoutError:
                assert held, "an empty pool refused a buffer that fits"
                continue
            assert ref.offset % ALIGN == 0
            buffer, _ = reader.view(ref, nbytes, "t")
            held.append((torch.frombuffer(buffer, dtype=torch.uint8), src))
            del buffer
            assert all(torch.equal(view, expected) for view, expected in held)
        held.clear()
        assert pool.wait_drained(0.1)


def test_full_pool_blocks_then_times_out_and_recovers(pool: ShmPool) -> None:
    reader = ShmReader()
    ref = pool.put(pattern(40 * KIB, 0))
    buffer, region = reader.view(ref, 40 * KIB, "t")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="40960 of 65536 held by 1 unreleased regions"):
        pool.put(pattern(40 * KIB, 1), timeout=0.05)
    assert time.monotonic() - start >= 0.05
    region.release()  # early release; the finalizer must not release again later
    pool.put(pattern(40 * KIB, 1), timeout=0.05)
    del buffer
    gc.collect()
    assert pool.bytes_in_use == 40 * KIB  # the new region is untouched by the old view's death


def test_wrapping_takes_an_exact_fit(pool: ShmPool) -> None:
    reader = ShmReader()
    first, _ = reader.view(pool.put(pattern(32 * KIB, 0)), 32 * KIB, "a")
    second, _ = reader.view(pool.put(pattern(32 * KIB, 1)), 32 * KIB, "b")
    del first  # frees [0, 32K) while [32K, 64K) stays held
    ref = pool.put(pattern(32 * KIB, 2), timeout=0)
    assert ref.offset == 0 and bytes(second) == bytes(pattern(32 * KIB, 1).numpy())


def test_slot_exhaustion_is_backpressure_too() -> None:
    with ShmPool(ShmPoolConfig(capacity_bytes=64 * KIB, num_slots=2, threshold_bytes=1)) as pool:
        pool.put(pattern(64, 0))
        pool.put(pattern(64, 1))
        with pytest.raises(TimeoutError):
            pool.put(pattern(64, 2), timeout=0)


def test_region_is_released_when_its_last_tensor_dies(pool: ShmPool) -> None:
    reader = ShmReader()
    msg = StageOutputChunk(request_id="r", stage_id=0, prompt_embeds=PromptEmbeds(torch.ones(4, 64)))
    out, regions = decode_with_regions(encode(msg, place=pool.put), shm=reader)
    data = out.prompt_embeds.data
    view = data[1:3]
    del out, data
    assert not regions[0].released and pool.bytes_in_use == 1 * KIB
    del view  # the last view
    assert regions[0].released and pool.wait_drained(0.1)


def test_forged_and_stale_descriptors_are_rejected(pool: ShmPool) -> None:
    reader = ShmReader()
    ref = pool.put(pattern(256, 0))
    forged = {
        "outside [0, 8)": ShmRef(ref.pool, ref.pid, ref.fd, 8, ref.gen, ref.offset),
        "outside the pool": ShmRef(ref.pool, ref.pid, ref.fd, ref.slot, ref.gen, 64 * KIB - 128),
        "aligned": ShmRef(ref.pool, ref.pid, ref.fd, ref.slot, ref.gen, 8),
        "generation": ShmRef(ref.pool, ref.pid, ref.fd, ref.slot, ref.gen + 1, ref.offset),
        "not an unclaimed region": ShmRef(ref.pool, ref.pid, ref.fd, ref.slot + 1, 0, ref.offset),
        "malformed shm pool name": ShmRef("/etc/passwd", ref.pid, ref.fd, ref.slot, ref.gen, ref.offset),
        "is not shm pool": ShmRef("omni_mp-pool-" + "0" * 32, ref.pid, 0, ref.slot, ref.gen, ref.offset),
        "cannot open": ShmRef("omni_mp-pool-" + "1" * 32, 2**22 + 1, 3, 0, 0, 0),
    }
    for needle, bad in forged.items():
        with pytest.raises(PayloadError, match=re.escape(needle)):
            reader.view(bad, 256, "t")
    buffer, _ = reader.view(ref, 256, "t")
    with pytest.raises(PayloadError, match="not an unclaimed region"):
        reader.view(ref, 256, "t")  # the same region twice
    with pytest.raises(PayloadError, match="moved"):
        reader.view(ShmRef(ref.pool, ref.pid, 0, ref.slot, ref.gen, ref.offset), 256, "t")
    del buffer
    assert pool.wait_drained(0.1)
    with pytest.raises(PayloadError, match="generation"):
        reader.view(ref, 256, "t")  # released and reclaimed: stale


def test_rejected_message_returns_its_credits(pool: ShmPool) -> None:
    reader = ShmReader()
    msg = StageOutputChunk(
        request_id="r", stage_id=0, additional_information={"a": torch.ones(64), "b": torch.ones(64)}
    )
    frames = encode(msg, place=pool.put)
    with pytest.raises(PayloadError, match="not referenced"):
        decode_with_regions([*frames, b"extra"], shm=reader)
    assert pool.wait_drained(0.1)
    with pytest.raises(PayloadError, match="does not accept"):
        decode_with_regions(encode(msg, place=pool.put))
    pool.free(ShmRef(pool.name, os.getpid(), 0, 0, 0, 0))  # stale: ignored


CHILD = textwrap.dedent(
    """
    import sys, time, torch, zmq
    from omni_mp.wire.messages import StageOutputChunk
    from omni_mp.wire.shm_pool import ShmPoolConfig
    from omni_mp.wire.transport import MessageReceiver, MessageSender
    role, endpoint, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = zmq.Context()
    if role == "sender":
        sender = MessageSender(ctx, endpoint, shm=ShmPoolConfig(capacity_bytes=1 << 20, threshold_bytes=1))
        for i in range(count):
            t = torch.full((256, 256), i, dtype=torch.float32)
            sender.send(StageOutputChunk(request_id=f"r{i}", stage_id=0, additional_information={"t": t}))
    else:
        receiver = MessageReceiver(ctx, endpoint)
        held = [receiver.recv(timeout=30) for _ in range(count)]
    print("ready", flush=True)
    time.sleep(60)
    """
)


def spawn(role: str, endpoint: str, count: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, role, endpoint, str(count)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )


def wait_ready(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def test_no_leak_when_either_side_is_killed(tmp_path: Path) -> None:
    """SIGKILL (1) a sender before its receiver mapped the pool, (2) a sender after, (3) a
    receiver holding regions. Nothing may show up in /dev/shm, the survivors keep working,
    and once the survivors drop their references no pool stays mapped."""
    shm_before = set(os.listdir("/dev/shm"))
    ep = [f"ipc://{tmp_path}/link{i}" for i in range(3)]
    ctx = zmq.Context()
    early = MessageReceiver(ctx, ep[0])
    late = MessageReceiver(ctx, ep[1])
    sender = MessageSender(ctx, ep[2], shm=ShmPoolConfig(capacity_bytes=1 << 20, threshold_bytes=1), linger_ms=100)
    children = [spawn("sender", ep[0], 1), spawn("sender", ep[1], 2), spawn("receiver", ep[2], 2)]
    try:
        for i in range(2):
            sender.send(
                StageOutputChunk(request_id=f"s{i}", stage_id=0, additional_information={"t": torch.ones(4096)})
            )
        for child in children:
            wait_ready(child)
        first = late.recv(timeout=10)  # maps the late sender's pool
        assert early.socket.poll(10_000) and late.socket.poll(10_000)  # queued, not decoded yet
        for child in children:
            kill(child)
        shm_during = set(os.listdir("/dev/shm"))

        # (1) the pool died with its creator before we mapped it: a clean error, then on.
        with pytest.raises(PayloadError, match="cannot open shm pool"):
            early.recv(timeout=1)
        # (2) what we mapped outlives the sender, also for a message still queued.
        second = late.recv(timeout=1)
        assert first.additional_information["t"].eq(0).all() and second.additional_information["t"].eq(1).all()
        # (3) the dead receiver never released: close() waits out its linger, then frees.
        assert sender.pool is not None and sender.pool.bytes_in_use > 0
        sender.close()
        del first, second
        gc.collect()
        for endpoint in (early, late):
            endpoint.close()
        assert our_mappings() == []
        new_shm = (shm_during | set(os.listdir("/dev/shm"))) - shm_before
        assert not [name for name in new_shm if "omni_mp" in name]
    finally:
        for child in children:
            if child.poll() is None:
                kill(child)
        ctx.destroy(linger=0)

"""Transport over real ZMQ sockets: links, routing, timeouts, MAXMSGSIZE, shm backpressure."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import torch
import zmq

from omni_mp.wire.codec import Limits, PayloadError, encode
from omni_mp.wire.messages import Heartbeat, PromptEmbeds, StageOutputChunk
from omni_mp.wire.shm_pool import ShmPoolConfig
from omni_mp.wire.transport import (
    MessageReceiver,
    MessageSender,
    make_socket,
    recv_message,
    recv_routed_message,
    send_message,
)

KIB = 1024


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def ipc(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/link"


def chunk(i: int = 0, **info: object) -> StageOutputChunk:
    return StageOutputChunk(request_id=f"r{i}", stage_id=1, token_ids=[i], additional_information=info or None)


@pytest.mark.parametrize(
    "shm", [None, ShmPoolConfig(capacity_bytes=1 << 20, threshold_bytes=KIB)], ids=["frames", "shm"]
)
def test_link_round_trip(ctx: zmq.Context, ipc: str, shm: ShmPoolConfig | None) -> None:
    hidden = torch.randn(64, 32).to(torch.bfloat16)  # 4 KiB: in the pool when there is one
    small = torch.arange(8)
    with MessageReceiver(ctx, ipc) as receiver, MessageSender(ctx, ipc, shm=shm) as sender:
        sender.send(
            StageOutputChunk(
                request_id="r", stage_id=1, prompt_embeds=PromptEmbeds(hidden), additional_information={"s": small}
            ),
            timeout=5,
        )
        msg = receiver.recv(timeout=5)
        assert torch.equal(msg.prompt_embeds.data, hidden) and torch.equal(msg.additional_information["s"], small)
        regions = receiver.regions(msg)
        assert len(regions) == (1 if shm else 0)
        receiver.release(msg)  # early release: frees the pool now, idempotent with GC later
        assert all(r.released for r in regions) and receiver.regions(msg) == []
        if sender.pool is not None:
            assert sender.pool.wait_drained(1.0)


def test_tcp_frames_round_trip(ctx: zmq.Context) -> None:
    with MessageReceiver(ctx, "tcp://127.0.0.1:*") as receiver:
        endpoint = receiver.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        with MessageSender(ctx, endpoint) as sender:
            t = torch.randn(300, 300)  # above pyzmq's copy threshold: zero-copy send
            sender.send(chunk(1, t=t), timeout=5)
            assert torch.equal(receiver.recv(timeout=5).additional_information["t"], t)


def test_dealer_router_with_plain_functions(ctx: zmq.Context, ipc: str) -> None:
    router = make_socket(ctx, zmq.ROUTER)
    router.bind(ipc)
    dealer = make_socket(ctx, zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"stage-1")
    dealer.connect(ipc)
    try:
        send_message(dealer, chunk(1, t=torch.ones(3)), timeout=5)
        identity, msg = recv_routed_message(router, timeout=5)
        assert identity == b"stage-1" and msg.additional_information["t"].tolist() == [1.0] * 3
        send_message(router, Heartbeat(stage_id=0, seq=1, time=2.0), routing_id=identity, timeout=5)
        assert recv_message(dealer, timeout=5) == Heartbeat(stage_id=0, seq=1, time=2.0)
    finally:
        router.close()
        dealer.close()


def test_receiver_survives_bad_messages(ctx: zmq.Context, ipc: str) -> None:
    with MessageReceiver(ctx, ipc) as receiver:
        raw = make_socket(ctx, zmq.PUSH)
        raw.connect(ipc)
        bad = [
            [b"not msgpack \xc1"],
            [msgspec.msgpack.encode({"t": "Unknown"})],
            [encode(chunk(0, t=torch.ones(4)))[0]],  # its tensor frame is missing
            [*encode(chunk(0))[:1], b"extra frame"],
        ]
        for frames in bad:
            raw.send_multipart(frames)
            raw.send_multipart(encode(chunk(7)))
            with pytest.raises(PayloadError):
                receiver.recv(timeout=5)
            assert receiver.recv(timeout=5).token_ids == [7]
        raw.close()


def test_timeouts(ctx: zmq.Context, ipc: str) -> None:
    with MessageReceiver(ctx, ipc, hwm=1) as receiver:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="receive"):
            receiver.recv(timeout=0.05)
        assert time.monotonic() - start >= 0.05
    with MessageSender(ctx, ipc, hwm=1, linger_ms=0) as sender, pytest.raises(TimeoutError, match="send"):
        for i in range(10):  # nobody listening: the queue fills up
            sender.send(chunk(i), timeout=0.05)


def test_sender_rejects_what_the_receiver_would(ctx: zmq.Context, ipc: str) -> None:
    limits = Limits(max_tensor_bytes=1024)
    with (
        MessageSender(ctx, ipc, limits, linger_ms=0) as sender,
        pytest.raises(PayloadError, match="max_tensor_bytes=1024"),
    ):
        sender.send(chunk(0, t=torch.zeros(512)), timeout=1)


def test_maxmsgsize_drops_oversized_and_keeps_serving(ctx: zmq.Context, ipc: str) -> None:
    """A peer bypassing sender-side validation: ZMQ drops the oversized frame (and that
    connection); the peer reconnects and later good messages arrive."""
    limits = Limits(max_tensor_bytes=64 * KIB, max_body_bytes=4 * KIB)
    with MessageReceiver(ctx, ipc, limits) as receiver:
        assert receiver.socket.getsockopt(zmq.MAXMSGSIZE) == 64 * KIB
        raw = make_socket(ctx, zmq.PUSH)
        raw.connect(ipc)
        raw.send_multipart(encode(chunk(1)))
        assert receiver.recv(timeout=5).token_ids == [1]
        raw.send_multipart([encode(chunk(2))[0], bytes(128 * KIB)])
        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:  # until the reconnect went through
            raw.send_multipart(encode(chunk(3, t=torch.ones(4))))
            try:
                got = receiver.recv(timeout=0.2)
            except TimeoutError:
                pass
        assert got is not None and got.token_ids == [3] and got.additional_information["t"].tolist() == [1.0] * 4
        raw.close(linger=0)


def test_shm_backpressure_until_the_receiver_lets_go(ctx: zmq.Context, ipc: str) -> None:
    shm = ShmPoolConfig(capacity_bytes=256 * KIB, threshold_bytes=KIB)
    with MessageReceiver(ctx, ipc) as receiver, MessageSender(ctx, ipc, shm=shm) as sender:
        held = []
        for i in range(2):
            sender.send(chunk(i, t=torch.full((100 * KIB // 4,), float(i))), timeout=1)
            held.append(receiver.recv(timeout=5))
        with pytest.raises(TimeoutError, match="shm pool .* full"):
            sender.send(chunk(2, t=torch.zeros(100 * KIB // 4)), timeout=0.05)
        assert sender.pool is not None and sender.pool.bytes_in_use == 200 * KIB  # the failed put was undone
        receiver.release(held[0])
        sender.send(chunk(3, t=torch.full((100 * KIB // 4,), 3.0)), timeout=1)
        assert receiver.recv(timeout=5).additional_information["t"][0].item() == 3.0
        held.clear()  # automatic release of the rest
        assert sender.pool.wait_drained(1.0)

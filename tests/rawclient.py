"""A bare DEALER client for the reliability tests: it sends any frames and records every
event it receives per request id, so lost or duplicated terminal events are visible (the
real client routes events into per-request queues and would hide a duplicate)."""

from __future__ import annotations

import time
from collections import defaultdict

import msgspec
import zmq

from omni_mp.wire.codec import decode, encode
from omni_mp.wire.messages import ErrorEvent, Finished, Message, StatusReply, StatusRequest

TERMINAL = (Finished, ErrorEvent)


class RawClient:
    def __init__(self, endpoint: str, *, rcvhwm: int = 1000) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.events: dict[str | None, list[Message]] = defaultdict(list)
        self.status: list[StatusReply] = []

    def send(self, msg: Message) -> None:
        self.sock.send_multipart(encode(msg))

    def send_raw(self, body: dict | bytes, *extra: bytes) -> None:
        frame = body if isinstance(body, bytes) else msgspec.msgpack.encode(body)
        self.sock.send_multipart([frame, *extra])

    def pump(self, timeout_s: float) -> int:
        """Receive for up to `timeout_s` (returns early once idle 0.2 s after something came)."""
        n = 0
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(min(left, 0.2) * 1000)):
                if n:
                    return n
                continue
            msg = decode(self.sock.recv_multipart())
            n += 1
            if isinstance(msg, StatusReply):
                self.status.append(msg)
            else:
                self.events[getattr(msg, "request_id", None)].append(msg)
        return n

    def terminals(self, rid: str | None) -> list[Message]:
        return [m for m in self.events.get(rid, []) if isinstance(m, TERMINAL)]

    def wait_terminal(self, rid: str, timeout_s: float) -> Message:
        deadline = time.monotonic() + timeout_s
        while not self.terminals(rid):
            assert time.monotonic() < deadline, f"no terminal event for {rid!r} within {timeout_s}s"
            self.pump(0.2)
        return self.terminals(rid)[0]

    def ask_status(self, tag: str, timeout_s: float = 5.0) -> StatusReply:
        self.send(StatusRequest(request_id=tag))
        deadline = time.monotonic() + timeout_s
        while True:
            for reply in self.status:
                if reply.request_id == tag:
                    return reply
            assert time.monotonic() < deadline, f"no status reply for {tag!r} within {timeout_s}s"
            self.pump(0.1)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()

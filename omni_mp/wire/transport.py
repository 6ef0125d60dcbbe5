"""ZMQ transport for payload messages.

- make_socket(): a socket whose MAXMSGSIZE, HWM and LINGER come from Limits / sane defaults.
- send_message() / recv_message() / recv_routed_message(): the codec on any socket type
  (DEALER/ROUTER included), with timeouts.
- MessageSender / MessageReceiver: the two ends of a PUSH/PULL stage-to-stage link, with
  the same-host shared-memory fast path (shm_pool) when the sender is given a pool config.

Timeouts are in seconds; None waits forever; running out raises TimeoutError. A receiver
that gets a bad message raises PayloadError and is ready for the next one (the whole
multipart message has been consumed).
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Self

import numpy as np
import zmq

from omni_mp.wire.codec import BufferPlacer, decode_with_regions, encode
from omni_mp.wire.messages import Message
from omni_mp.wire.shm_pool import ShmPool, ShmPoolConfig, ShmReader, ShmRef, ShmRegion
from omni_mp.wire.tensor_codec import DEFAULT_LIMITS, Limits

# Messages queued per direction before a sender blocks. Stage links carry per-step chunks:
# enough to absorb jitter, few enough that a stalled consumer pushes back within a few
# steps instead of buffering gigabytes of hidden states.
DEFAULT_HWM = 64
# Queue depth of the runtime's own sockets (coordinator events and client port, stage inputs
# and stage-to-stage links). Per-step chunks of a full batch arrive together; this absorbs
# bursts, and a peer that stops reading still pushes back (senders wait with a timeout) long
# before memory is at risk.
CONTROL_HWM = 4096
# On close, how long a sender keeps trying to deliver what is queued (and waits for its
# pool to be drained): long enough for a clean shutdown, short enough to never hang one.
SENDER_LINGER_MS = 1000


def make_socket(
    ctx: zmq.Context, socket_type: int, limits: Limits = DEFAULT_LIMITS, *, hwm: int = DEFAULT_HWM, linger_ms: int = 0
) -> zmq.Socket:
    """A socket that makes ZMQ itself drop any frame larger than a valid message can have.
    ZMQ enforces MAXMSGSIZE by disconnecting the peer that sent it; the peer reconnects on
    its own, but messages it had queued on that connection may be lost."""
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_frame_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    return sock


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _poll(sock: zmq.Socket, event: int, deadline: float | None, what: str) -> None:
    remaining = _remaining(deadline)
    # zmq_poll rather than Socket.poll, which builds a Poller each call (~1.5 us a hop).
    if not zmq.zmq_poll([(sock, event)], -1 if remaining is None else math.ceil(remaining * 1000)):
        raise TimeoutError(f"timed out waiting to {what} on {sock.getsockopt_string(zmq.LAST_ENDPOINT) or 'socket'}")


def send_message(
    sock: zmq.Socket,
    msg: Message,
    limits: Limits = DEFAULT_LIMITS,
    *,
    timeout: float | None = None,
    shm: ShmPool | None = None,
    routing_id: bytes | None = None,
) -> int:
    """Validate, encode and send `msg`. Large frames go zero-copy (pyzmq copies frames below
    its copy_threshold, 64 KiB): do not modify sent tensors in place until delivered.
    With `shm`, tensors the pool accepts are copied into it instead (waiting for space
    within `timeout`). `routing_id` prefixes the identity frame a ROUTER socket needs."""
    deadline = _deadline(timeout)
    placed: list[ShmRef] = []
    place: BufferPlacer | None = None
    if shm is not None:
        pool = shm

        def place(data: np.ndarray) -> ShmRef | None:
            if not pool.accepts(data.size):
                return None
            ref = pool.put(data, _remaining(deadline))
            placed.append(ref)
            return ref

    try:
        frames = encode(msg, limits, place=place)
        if routing_id is not None:
            frames.insert(0, routing_id)
        while True:
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return sum(memoryview(f).nbytes for f in frames)
            except zmq.Again:
                _poll(sock, zmq.POLLOUT, deadline, "send")
    except BaseException:
        for ref in placed:  # never sent: give the space back
            pool.free(ref)
        raise


def _recv_frames(sock: zmq.Socket, timeout: float | None) -> list[zmq.Frame]:
    _poll(sock, zmq.POLLIN, _deadline(timeout), "receive")
    return sock.recv_multipart(copy=False)


def recv_message(
    sock: zmq.Socket, limits: Limits = DEFAULT_LIMITS, *, timeout: float | None = None, shm: ShmReader | None = None
) -> Message:
    """Receive and decode one message (tensors are zero-copy views of the frames or of
    shared memory; shared-memory regions are released when their tensors are freed)."""
    return decode_with_regions(_recv_frames(sock, timeout), limits, shm=shm)[0]


def recv_routed_message(
    sock: zmq.Socket, limits: Limits = DEFAULT_LIMITS, *, timeout: float | None = None, shm: ShmReader | None = None
) -> tuple[bytes, Message]:
    """recv_message for a ROUTER socket: also returns the sender's routing id."""
    frames = _recv_frames(sock, timeout)
    return frames[0].bytes, decode_with_regions(frames[1:], limits, shm=shm)[0]


class _LinkEnd:
    """A socket of one link, made by make_socket and bound or connected."""

    def __init__(
        self, ctx: zmq.Context, socket_type: int, endpoint: str, limits: Limits, bind: bool, hwm: int, linger_ms: int
    ) -> None:
        self.limits = limits
        self.socket = make_socket(ctx, socket_type, limits, hwm=hwm, linger_ms=linger_ms)
        # A SecureContext carries the process's CURVE identity: binds serve, connects authenticate.
        curve = getattr(ctx, "curve", None)
        try:
            if curve is not None:
                curve.server(self.socket) if bind else curve.client(self.socket)
            self.socket.bind(endpoint) if bind else self.socket.connect(endpoint)
        except BaseException:
            self.socket.close()
            raise

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MessageSender(_LinkEnd):
    """The upstream end of a PUSH/PULL link. Connects by default (the consumer binds).

    `shm` enables the shared-memory pool for this link: only for a receiver on the same host,
    and one receiver per sender (the pool is flow-controlled by exactly one consumer)."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        limits: Limits = DEFAULT_LIMITS,
        *,
        bind: bool = False,
        shm: ShmPoolConfig | None = None,
        hwm: int = DEFAULT_HWM,
        linger_ms: int = SENDER_LINGER_MS,
    ) -> None:
        super().__init__(ctx, zmq.PUSH, endpoint, limits, bind, hwm, linger_ms)
        self.linger_ms = linger_ms
        self.pool = ShmPool(shm) if shm is not None else None

    def send(self, msg: Message, timeout: float | None = None) -> int:
        """Send `msg`; returns the bytes that went over the socket (shared memory excluded)."""
        return send_message(self.socket, msg, self.limits, timeout=timeout, shm=self.pool)

    def close(self) -> None:
        """Close the socket (ZMQ keeps delivering queued messages for up to linger_ms) and,
        within the same linger, let the receiver consume what is in the pool before it goes:
        a receiver that has not mapped the pool yet could not do so once it is closed."""
        super().close()
        if self.pool is not None:
            self.pool.wait_drained(self.linger_ms / 1000)
            self.pool.close()
            self.pool = None


class MessageReceiver(_LinkEnd):
    """The downstream end of a PUSH/PULL link. Binds by default.

    Shared-memory tensors in a received message are views of the sender's pool; the space
    returns to the sender when the last of them is freed, or at release(msg) (after which
    they must no longer be used). Poll `socket` to wait on several links at once."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        limits: Limits = DEFAULT_LIMITS,
        *,
        bind: bool = True,
        accept_shm: bool = True,
        hwm: int = DEFAULT_HWM,
    ) -> None:
        super().__init__(ctx, zmq.PULL, endpoint, limits, bind, hwm, linger_ms=0)
        self._shm = ShmReader() if accept_shm else None
        # id(msg) -> (weak ref to msg, its regions); the entry goes when the message does.
        self._held: dict[int, tuple[weakref.ref, list[ShmRegion]]] = {}

    def recv(self, timeout: float | None = None) -> Message:
        msg, regions = decode_with_regions(_recv_frames(self.socket, timeout), self.limits, shm=self._shm)
        if regions:
            key = id(msg)
            held = self._held
            held[key] = (weakref.ref(msg, lambda _, key=key: held.pop(key, None)), regions)
        return msg

    def regions(self, msg: Message) -> list[ShmRegion]:
        """The shared-memory regions `msg` still holds (empty for frame-only messages)."""
        entry = self._held.get(id(msg))
        return [r for r in entry[1] if not r.released] if entry and entry[0]() is msg else []

    def release(self, msg: Message) -> None:
        """Return `msg`'s shared-memory space to the sender now, instead of when its tensors
        are freed. Call it once those tensors are copied or no longer used."""
        for region in self.regions(msg):
            region.release()
        self._held.pop(id(msg), None)

    def close(self) -> None:
        super().close()
        if self._shm is not None:
            self._shm.close()

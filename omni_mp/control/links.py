"""The coordinator's outgoing sockets, which never block its loop.

`StageLink`: coordinator -> one stage. Sends without waiting; what ZMQ cannot take yet waits
in a bounded outbox, control messages (Abort, Connect, Shutdown) ahead of registrations, so
an abort never queues behind bulk work the coordinator holds. A registration still in the
outbox when its request ends is dropped instead of being sent and aborted.

`ClientPort`: the client ROUTER. ROUTER_MANDATORY makes ZMQ report a full or vanished peer
instead of silently dropping; a full peer's messages wait in a per-client outbox, where
stream chunks are refused once `queue_len` messages are waiting (the coordinator ends that
stream with `slow_consumer`) and answers the client waits for (terminal events, refusals,
status) are kept, up to a hard cap that only a client which never reads can reach: it is
then treated as gone (its requests end, its outbox is dropped), so memory stays bounded.
A client's disconnection is seen on the socket's monitor (the connection's fd, which the
client's messages also carry as SRCFD), so the requests of a client that vanished can be
aborted at once instead of running to their end for no one. A failed handshake (a client
without keys, or with keys not listed) is logged, at most once per HANDSHAKE_LOG_S.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import OrderedDict, deque

import zmq
from zmq.utils.monitor import recv_monitor_message

from omni_mp.wire.codec import Buffer, Limits, PayloadError, decode, encode
from omni_mp.wire.keys import CLIENT_DOMAIN, HANDSHAKE_FAILED, CurveIdentity
from omni_mp.wire.messages import Message, StageRequest
from omni_mp.wire.transport import CONTROL_HWM, MessageSender, make_socket

log = logging.getLogger("omni_mp.control.links")
HANDSHAKE_LOG_S = 10.0  # a refused client retries every 0.1-0.2 s: one line per this many seconds


def _try_send(sock: zmq.Socket, frames: list[Buffer]) -> bool:
    """Send now or say no (zmq.Again); other ZMQ errors propagate."""
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        return True
    except zmq.Again:
        return False


class StageLink:
    def __init__(self, sender: MessageSender, limits: Limits, max_queue: int) -> None:
        self.sender = sender
        self.limits = limits
        self.max_queue = max_queue
        self.control: deque[list[Buffer]] = deque()
        self.bulk: OrderedDict[str, list[Buffer]] = OrderedDict()  # request id -> its StageRequest

    @property
    def socket(self) -> zmq.Socket:
        return self.sender.socket

    def full(self) -> bool:
        """No room for more registrations: admission stops until the stage catches up."""
        return len(self.bulk) >= self.max_queue

    def stalled(self) -> bool:
        """Control messages pile up: the stage has stopped reading (hung)."""
        return len(self.control) > self.max_queue

    def pending(self) -> bool:
        return bool(self.control or self.bulk)

    def register(self, msg: StageRequest) -> None:
        self.bulk[msg.request_id] = encode(msg, self.limits)
        self.flush()

    def send_control(self, msg: Message) -> None:
        self.control.append(encode(msg, self.limits))
        self.flush()

    def abort(self, request_id: str, msg: Message) -> None:
        """End a request here: drop its unsent registration, else send `msg` (an Abort)."""
        if self.bulk.pop(request_id, None) is None:
            self.send_control(msg)

    def flush(self) -> None:
        sock = self.sender.socket
        while self.control and _try_send(sock, self.control[0]):
            self.control.popleft()
        while not self.control and self.bulk:
            rid = next(iter(self.bulk))
            if not _try_send(sock, self.bulk[rid]):
                return
            del self.bulk[rid]

    def close(self) -> None:
        self.sender.socket.close(linger=0)


class ClientPort:
    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        limits: Limits,
        queue_len: int,
        curve: CurveIdentity | None,
        max_inflight: int = 1024,
    ) -> None:
        self.limits = limits
        self.queue_len = queue_len
        self.socket = make_socket(ctx, zmq.ROUTER, limits, hwm=CONTROL_HWM)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if curve is not None:
            curve.server(self.socket, CLIENT_DOMAIN)
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        self.socket.bind(endpoint)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.outbox: dict[bytes, deque[list[Buffer]]] = {}
        self.hard_cap = 16 * queue_len + max_inflight
        self._client_at: dict[int, bytes] = {}  # connection fd -> the client that last wrote on it
        self._gone: list[bytes] = []
        self._dropped: set[bytes] = set()  # clients given up on (never reading) while still connected
        self._handshakes_failed = 0
        self._handshake_logged_at = -HANDSHAKE_LOG_S

    def pending(self) -> bool:
        return bool(self.outbox)

    def send(self, client: bytes, msg: Message, *, droppable: bool) -> str | None:
        """Send or queue `msg`: None, or why not: "gone" (the client left) or "full" (a
        `droppable` message and the client's queue is full)."""
        if client in self._dropped:
            return "gone"
        frames = [client, *encode(msg, self.limits)]
        queued = self.outbox.get(client)
        if queued is not None:
            if droppable and len(queued) >= self.queue_len:
                return "full"
            if len(queued) >= self.hard_cap:
                log.error("client %s reads nothing (%d messages waiting): treated as gone", client.hex(), len(queued))
                self._dropped.add(client)  # until it disconnects
                self._lost(client)
                return "gone"
            queued.append(frames)
            return None
        try:
            if not _try_send(self.socket, frames):
                self.outbox[client] = deque([frames])
        except zmq.ZMQError as err:
            if err.errno == errno.EHOSTUNREACH:
                self._lost(client)
                return "gone"
            raise
        return None

    def _lost(self, client: bytes) -> None:
        self.outbox.pop(client, None)
        if client not in self._gone:
            self._gone.append(client)

    def flush(self) -> None:
        """Send what the clients can take now (clients found gone show in disconnected())."""
        for client, queued in list(self.outbox.items()):
            try:
                while queued and _try_send(self.socket, queued[0]):
                    queued.popleft()
            except zmq.ZMQError as err:
                if err.errno != errno.EHOSTUNREACH:
                    raise
                self._lost(client)
                continue
            if not queued:
                del self.outbox[client]

    def _read_monitor(self) -> None:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["event"] & HANDSHAKE_FAILED:  # (its value is an error code, not a connection's fd)
                self._handshake_failed(event["event"])
                continue
            client = self._client_at.pop(event["value"], None)  # ACCEPTED: the fd is reused, a new peer
            if client is not None and event["event"] == zmq.EVENT_DISCONNECTED:
                self._dropped.discard(client)
                self._lost(client)

    def _handshake_failed(self, event: int) -> None:
        self._handshakes_failed += 1
        now = time.monotonic()
        if now - self._handshake_logged_at >= HANDSHAKE_LOG_S:
            why = "key not listed" if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH else "missing, wrong or unneeded keys"
            log.warning(
                "%s: a client's handshake failed (%s; %d since the last line): it gets no service",
                self.endpoint, why, self._handshakes_failed,
            )  # fmt: skip
            self._handshakes_failed, self._handshake_logged_at = 0, now

    def disconnected(self) -> list[bytes]:
        """The clients found gone since the last call (connection closed, or never reading)."""
        self._read_monitor()
        gone, self._gone = self._gone, []
        return gone

    def recv(self) -> tuple[bytes, Message | PayloadError]:
        """One message: (client, message) or (client, the reason it is invalid). Raises
        zmq.Again when there is nothing to read."""
        frames = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        client = frames[0].bytes
        self._read_monitor()  # (a connection's ACCEPTED comes before its messages)
        self._client_at[frames[0].get(zmq.SRCFD)] = client
        try:
            return client, decode(frames[1:], self.limits)
        except PayloadError as err:
            return client, err

    def close(self, linger_ms: int) -> None:
        self.flush()
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=linger_ms)

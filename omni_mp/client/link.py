"""The state of a client's connection to its coordinator, from the socket's monitor events.

A DEALER that cannot connect, or whose CURVE handshake fails, queues what it is sent and
retries forever: without this a request would wait for an answer that can never come.
`LinkWatch` turns the monitor's events into answers: a failed handshake is a `HandshakeError`
at once (and the socket stops retrying), no connection within `connect_timeout_s` is a
`TimeoutError`, and a connection lost while requests are in flight fails them (the
coordinator aborts a vanished client's requests, so no answer would ever come)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from omni_mp.wire.keys import HANDSHAKE_FAILED

# How long a request waits for a connection to the endpoint before it fails.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# A coordinator that shuts down answers what is in flight, then closes: the reader gets this
# long to deliver those answers (already in the socket) before the rest are failed as lost.
LOST_GRACE_S = 0.2
_WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED
_KEYS_HOWTO = (
    "pass keys=client_identity(DIR, NAME) from the pipeline's key directory (`omni-mp keys DIR --client NAME`)"
)


class HandshakeError(ConnectionError):
    """The security handshake with the endpoint failed: missing, wrong or unlisted keys."""


def handshake_error(endpoint: str, event: int, value: int, keyed: bool) -> HandshakeError:
    """What a failed handshake most likely means, and what to check."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        why = "the pipeline refused this client's key: its public key is not in the pipeline's DIR/clients/"
        fix = "add it with `omni-mp keys DIR --client NAME` and use that NAME's keys"
    elif not keyed:
        why = "this client has no CURVE keys and the endpoint requires them (a pipeline with `security.keys`)"
        fix = _KEYS_HOWTO
    elif value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH or event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        why = "the endpoint does not use CURVE (a pipeline without `security.keys`), or the server key is wrong"
        fix = "connect without keys to a pipeline without `security.keys`; otherwise use its DIR/server.key"
    else:
        why = "the endpoint did not accept this client's keys (a server key from another key directory?)"
        fix = "use NAME.key_secret and server.key from the pipeline's own key directory"
    return HandshakeError(f"{endpoint}: CURVE handshake failed: {why}; {fix}")


class LinkWatch:
    def __init__(self, sock: zmq.asyncio.Socket, endpoint: str, keyed: bool, connect_timeout_s: float) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.keyed = keyed
        self.connect_timeout_s = connect_timeout_s
        self.monitor = sock.get_monitor_socket(_WATCHED)
        self.connected = False
        self.failure: HandshakeError | None = None
        self._changed = asyncio.Event()

    async def run(self, on_lost: Callable[[Exception], None]) -> None:
        """Follow the monitor; `on_lost(error)` fails what is in flight when the link breaks."""
        while True:
            event = parse_monitor_message(await self.monitor.recv_multipart())
            kind, value = event["event"], event["value"]
            if kind & HANDSHAKE_FAILED:
                self.failure = handshake_error(self.endpoint, kind, value, self.keyed)
                self.connected = False
                self.sock.disconnect(self.endpoint)  # retrying with the same keys cannot succeed
                on_lost(self.failure)
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
            elif kind == zmq.EVENT_DISCONNECTED and self.connected:
                self.connected = False
                await asyncio.sleep(LOST_GRACE_S)
                on_lost(ConnectionError(f"{self.endpoint}: connection lost; the requests in flight on it are lost"))
            self._changed.set()

    async def ready(self, limit_s: float | None = None) -> None:
        """Return once connected; raise the handshake's error, or TimeoutError after
        `connect_timeout_s` (or `limit_s`, if shorter)."""
        loop = asyncio.get_running_loop()
        wait_s = self.connect_timeout_s if limit_s is None else min(limit_s, self.connect_timeout_s)
        until = loop.time() + wait_s
        while self.failure is None and not self.connected:
            left = until - loop.time()
            if left <= 0:
                raise TimeoutError(
                    f"{self.endpoint}: no connection within {wait_s:g}s: is a pipeline serving there? "
                    "(`connect_timeout_s` sets this wait)"
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)

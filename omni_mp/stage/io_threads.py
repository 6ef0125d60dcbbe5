"""The threads beside a stage's engine thread: socket I/O, encoding and heartbeats.

The engine thread only schedules and steps (as vLLM's `EngineCoreProc` keeps its busy loop
free of socket work). Each socket belongs to exactly one thread (ZMQ sockets are not
thread-safe):
- `InputPump` receives and decodes (validating before any tensor exists) into the `Inbox`:
  control messages (aborts, registrations, shutdown, link changes) on a path of their own,
  so they never queue behind bulk upstream data;
- `OutputPump` encodes and sends what the engine thread queued: events to the coordinator,
  step batches downstream (it owns the downstream links, so it also applies `Connect`);
- `Heartbeater` sends heartbeats on a socket of its own, so a send blocked on a slow
  consumer never starves them; it beats only while the engine thread shows progress, so
  a wedged engine is still detected as hung.
Every queue is bounded: a full one blocks its producer, which is backpressure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from omni_mp.wire.codec import Limits, PayloadError, split_unsendable
from omni_mp.wire.messages import (
    Connect,
    Connected,
    ErrorEvent,
    Heartbeat,
    Message,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
    StageStats,
)
from omni_mp.wire.shm_pool import ShmPoolConfig
from omni_mp.wire.transport import CONTROL_HWM, MessageReceiver, MessageSender

log = logging.getLogger("omni_mp.stage")

POLL_MS = 50  # how often a blocked thread re-checks that the stage is still running
INBOX_DATA_MAX = 1024  # decoded upstream batches waiting for the engine thread
INBOX_CONTROL_MAX = 65536  # control messages (small) waiting for the engine thread
OUTBOX_MAX = 256  # messages waiting to be encoded and sent
# Sends wait at most this long for queue space (a consumer that stays full this long is hung;
# the coordinator then restarts or fails it).
SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class InputError:
    """A message the input thread could not decode (the engine thread fails what it names)."""

    error: PayloadError


class Stopped(Exception):
    """The stage is shutting down."""


class Inbox:
    """Decoded messages for the engine thread: control first, then data, both bounded."""

    def __init__(self, stop: threading.Event) -> None:
        self._control: deque[Message | InputError | Any] = deque()
        self._data: deque[Message] = deque()
        self._cond = threading.Condition()
        self._stop = stop

    def put(self, item: Message | InputError | Any) -> None:
        """A decoded message, or an item of the stage's own threads (a prepared request):
        small items take the control path."""
        control = not isinstance(item, (StageOutputBatch, StageOutputChunk))
        queue, limit = (self._control, INBOX_CONTROL_MAX) if control else (self._data, INBOX_DATA_MAX)
        with self._cond:
            while len(queue) >= limit:  # backpressure: the input socket fills, then the senders wait
                if self._stop.is_set():
                    raise Stopped
                self._cond.wait(POLL_MS / 1000)
            queue.append(item)
            self._cond.notify_all()

    def take(self, timeout_s: float, max_data: int = 64) -> list[Message | InputError | Any]:
        """Everything of the control path and up to `max_data` data messages; waits up to
        `timeout_s` for the first one."""
        with self._cond:
            if not self._control and not self._data and timeout_s > 0:
                self._cond.wait(timeout_s)
            items: list[Message | InputError | Any] = list(self._control)
            self._control.clear()
            for _ in range(min(max_data, len(self._data))):
                items.append(self._data.popleft())
            if items:
                self._cond.notify_all()
            return items


class InputPump(threading.Thread):
    """Receives into the inbox; a registration goes to `on_request` instead (the stage loop's
    `_arrived`, on this thread: it stamps it and starts an entry stage's preparation)."""

    def __init__(
        self,
        link: MessageReceiver,
        inbox: Inbox,
        stop: threading.Event,
        stage_id: int,
        on_request: Callable[[StageRequest], None] | None = None,
    ) -> None:
        super().__init__(name=f"stage{stage_id}-input", daemon=True)
        self.link, self.inbox, self.stop, self.stage_id = link, inbox, stop, stage_id
        self.on_request = on_request
        self.error: BaseException | None = None
        self._recv_s = 0.0  # receive + decode time of delivered messages, since take_recv_s()
        self._recv_lock = threading.Lock()

    def take_recv_s(self) -> float:
        """Seconds spent receiving and decoding messages since the last call (for the timeline)."""
        with self._recv_lock:
            s, self._recv_s = self._recv_s, 0.0
        return s

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.link.socket.poll(POLL_MS):
                    continue
                while not self.stop.is_set():
                    t0 = time.perf_counter()
                    try:
                        msg: Message | InputError = self.link.recv(timeout=0)
                    except TimeoutError:
                        break
                    except PayloadError as err:
                        log.error("stage %d dropped an invalid message: %s", self.stage_id, err)
                        msg = InputError(err)
                    with self._recv_lock:
                        self._recv_s += time.perf_counter() - t0
                    if self.on_request is not None and isinstance(msg, StageRequest):
                        self.on_request(msg)
                    else:
                        self.inbox.put(msg)
        except Stopped:
            pass
        except BaseException as err:  # noqa: BLE001 - reported by the engine thread, which exits
            self.error = err
            self.stop.set()


@dataclass(frozen=True, slots=True)
class Outgoing:
    msg: Message
    to_events: bool  # to the coordinator
    downstream: bool  # to the downstream stages
    step: int = -1  # the engine step it belongs to (for the timeline), -1 for none
    # With `downstream`: the (stage, replica) links its requests are bound to; None: every link.
    targets: tuple[tuple[int, int], ...] | None = None


class OutputPump(threading.Thread):
    """Encodes and sends; owns the events link and the downstream links."""

    def __init__(
        self,
        ctx: zmq.Context,
        events: MessageSender,
        limits: Limits,
        shm: Mapping[int, ShmPoolConfig] | None,  # per downstream stage: its links' pool (none: no pool)
        stop: threading.Event,
        stage_id: int,
        on_sent: Callable[[int, float, float, dict[int, int]], None],
        replica: int = 0,
    ) -> None:
        super().__init__(name=f"stage{stage_id}-output", daemon=True)
        self.ctx, self.events, self.limits, self.shm = ctx, events, limits, shm
        self.stop, self.stage_id, self.on_sent, self.replica = stop, stage_id, on_sent, replica
        self.downstream: dict[tuple[int, int], MessageSender] = {}  # (stage, replica) -> its link
        self._queue: deque[Outgoing | Connect | None] = deque()
        self._cond = threading.Condition()
        self.error: BaseException | None = None

    # ---- engine thread side ------------------------------------------------------------------
    def put(self, item: Outgoing | Connect | None, alive: Callable[[], None]) -> None:
        """Queue for sending; waits while the queue is full (calling `alive` meanwhile: waiting
        on a slow consumer is backpressure, not a hang). None: flush and stop."""
        with self._cond:
            while len(self._queue) >= OUTBOX_MAX and item is not None:
                if self.error is not None or not self.is_alive():
                    raise RuntimeError(f"stage {self.stage_id}: the output thread stopped: {self.error!r}")
                alive()
                self._cond.wait(POLL_MS / 1000)
            self._queue.append(item)
            self._cond.notify_all()

    # ---- output thread ---------------------------------------------------------------------
    def _connect(self, msg: Connect) -> None:
        for target in msg.downstream:
            key = (target.stage_id, target.replica)
            old = self.downstream.pop(key, None)
            if old is not None:
                old.close()
            pool = None if self.shm is None else self.shm.get(target.stage_id)
            self.downstream[key] = MessageSender(self.ctx, target.endpoint, self.limits, shm=pool, hwm=CONTROL_HWM)
        # The coordinator admits requests only once every link is open (a pool is prefaulted
        # when it is created: doing that under the first request would delay it).
        connected = Connected(stage_id=self.stage_id, downstream=list(msg.downstream), replica=self.replica)
        self._send_one(self.events, connected)

    def _send_one(self, link: MessageSender, msg: Message) -> int:
        """Send within SEND_TIMEOUT_S, in short waits so that a shutdown is not held up by a
        consumer that stopped reading (a timed-out attempt sends nothing and frees its slots)."""
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while True:
            try:
                return link.send(msg, timeout=POLL_MS / 1000)
            except TimeoutError:
                if self.stop.is_set() or time.monotonic() > deadline:
                    raise

    def _send(self, item: Outgoing) -> None:
        t0, cpu0 = time.perf_counter(), time.thread_time()
        msg: Message | None = item.msg
        wire_bytes: dict[int, int] = {}  # downstream stage -> bytes over its socket (shared memory excluded)
        # Every link encodes with the stage's limits, so a message that cannot be encoded
        # fails on the first link, before any of it was sent: its requests fail instead
        # (the coordinator then aborts them everywhere) and the rest goes out. Each round
        # sends fewer chunks or nothing, so this ends.
        while msg is not None:
            try:
                wire_bytes = self._deliver(item, msg)
                break
            except PayloadError as err:
                msg, failed = split_unsendable(msg, err, self.limits)
                self._fail_unsendable(failed)
        if item.step >= 0:
            self.on_sent(item.step, time.perf_counter() - t0, time.thread_time() - cpu0, wire_bytes)

    def _deliver(self, item: Outgoing, msg: Message) -> dict[int, int]:
        """Send `msg` where `item` says; the bytes that went to each downstream stage over sockets."""
        wire_bytes: dict[int, int] = {}
        if item.downstream:
            keys = list(self.downstream) if item.targets is None else item.targets
            for key in keys:
                link = self.downstream.get(key)
                if link is None:  # not linked (yet): the coordinator admits none bound to it
                    continue
                try:
                    wire_bytes[key[0]] = wire_bytes.get(key[0], 0) + self._send_one(link, msg)
                except TimeoutError:
                    if self.stop.is_set():
                        return wire_bytes
                    self._fail_undelivered(key, msg)
        if item.to_events:
            try:
                self._send_one(self.events, msg)
            except TimeoutError:
                if not self.stop.is_set():  # the coordinator took nothing for SEND_TIMEOUT_S
                    raise
        return wire_bytes

    def _fail_unsendable(self, failed: dict[str, str]) -> None:
        for rid, reason in failed.items():
            log.error("stage %d: request %s: output not sendable: %s", self.stage_id, rid, reason)
            text = f"stage {self.stage_id} could not send the request's output: {reason}"
            text = text[: self.limits.max_string_length]  # never unsendable itself
            self._send_one(
                self.events, ErrorEvent(request_id=rid, stage_id=self.stage_id, code="limit_exceeded", message=text)
            )

    def _fail_undelivered(self, key: tuple[int, int], msg: Message) -> None:
        """A downstream stage took nothing for SEND_TIMEOUT_S (it is hung; the coordinator
        restarts it): the requests of the dropped message end with the reason, nothing else."""
        ids = [c.request_id for c in msg.chunks] if isinstance(msg, StageOutputBatch) else []
        where = f"stage {key[0]} replica {key[1]}"
        log.error(
            "stage %d: %s took nothing for %.0fs; failing %d request(s)", self.stage_id, where, SEND_TIMEOUT_S, len(ids)
        )
        for rid in dict.fromkeys(ids):
            text = f"stage {self.stage_id} could not deliver to {where} for {SEND_TIMEOUT_S:.0f}s"
            self._send_one(
                self.events, ErrorEvent(request_id=rid, stage_id=self.stage_id, code="stage_unavailable", message=text)
            )

    def run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue:
                        self._cond.wait(POLL_MS / 1000)
                    item = self._queue.popleft()
                    self._cond.notify_all()
                if item is None:
                    return
                if isinstance(item, Connect):
                    self._connect(item)
                else:
                    self._send(item)
        except BaseException as err:  # noqa: BLE001 - reported by the engine thread, which exits
            log.error("stage %d: output thread failed: %r", self.stage_id, err)
            self.error = err
            self.stop.set()

    def close_links(self) -> None:
        for link in self.downstream.values():
            link.close()  # senders linger briefly so the last messages reach their peer
        self.downstream.clear()


class Heartbeater(threading.Thread):
    """Beats every `interval_s` while the engine thread reported progress within `stale_s`;
    each beat carries the snapshot `stats` returns (none while the engine starts)."""

    def __init__(
        self,
        link: MessageSender,
        stage_id: int,
        interval_s: float,
        stale_s: float,
        last_alive: Callable[[], float],
        stop: threading.Event,
        stats: Callable[[], StageStats] | None = None,
        replica: int = 0,
    ) -> None:
        super().__init__(name=f"stage{stage_id}-heartbeat", daemon=True)
        self.link, self.stage_id, self.interval_s, self.stale_s = link, stage_id, interval_s, stale_s
        self.replica = replica
        self.last_alive, self.stop, self.stats = last_alive, stop, stats

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            if time.monotonic() - self.last_alive() < self.stale_s:
                seq += 1
                stats = None if self.stats is None else self.stats()
                try:
                    self.link.send(
                        Heartbeat(stage_id=self.stage_id, seq=seq, time=time.time(), stats=stats, replica=self.replica),
                        timeout=self.interval_s,
                    )
                except TimeoutError:
                    pass  # the coordinator is not reading: nothing to tell it
            self.stop.wait(self.interval_s)

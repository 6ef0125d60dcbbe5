"""A per-step timeline of one stage, for profiling pipelines (`OMNI_MP_PROFILE_DIR`).

One record per engine step: when it started, how long the step took, how long the engine
thread waited for input before it, how many requests produced output, how many hidden-state
or step-embedding rows moved, how long the engine thread spent building outputs, and (filled
in by the output thread) how long encoding and sending them took and how many bytes went
over sockets to downstream stages; on the receive side, how long the input thread spent
receiving and decoding messages and the engine thread handling them since the previous step. Bounded: the newest
`MAX_STEPS` steps are kept. Written as JSON when the stage exits.

`StageCounters`, always on, keeps the totals the stage reports with its heartbeats (`StageStats`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path

import msgspec

from omni_mp.wire.messages import LinkBytes, StageStats

MAX_STEPS = 200_000
PROFILE_DIR_ENV = "OMNI_MP_PROFILE_DIR"


class StepRecord(msgspec.Struct, array_like=True):
    step: int
    t: float  # time.time() at the step's start
    step_ms: float  # engine.step()
    wait_ms: float  # idle wait for input since the previous step
    reqs: int  # requests with output in this step
    rows: int  # hidden-state rows emitted (or step-embedding rows taken) in this step
    build_ms: float  # engine thread: outputs -> messages queued
    send_ms: float = 0.0  # output thread: encode + send of this step's messages
    wire_bytes: int = 0  # bytes of them sent to downstream stages over sockets (not shared memory)
    # Receive side, since the previous step: the input thread's receive + decode of messages
    # (validation, tensors from buffers or shared memory), and the engine thread's handling
    # of them (processors building rows, step embeddings handed to the engine).
    recv_ms: float = 0.0
    handle_ms: float = 0.0
    # CPU time of the build and of the send (time.thread_time of their threads): the wall times
    # above also hold waits for the GIL while another thread of the process runs Python.
    build_cpu_ms: float = 0.0
    send_cpu_ms: float = 0.0
    # Model steps begun and ended in this step (`StageEngine.step_progress`): (1, 1) for an
    # engine step that computed anything, unless a model step ran over several engine steps
    # (a diffusion step in parts: begun in one, ended in a later one; begun again without
    # ending when new requests restarted it). A model step's time is the sum over its records.
    steps_begun: int = 0
    steps_ended: int = 0


class StepTimeline:
    def __init__(self, stage_id: int) -> None:
        self.stage_id = stage_id
        self.enabled = bool(os.environ.get(PROFILE_DIR_ENV))
        self.records: deque[StepRecord] = deque(maxlen=MAX_STEPS)
        self._by_step: dict[int, StepRecord] = {}
        self._lock = threading.Lock()
        self.steps = 0

    def add(self, record: StepRecord) -> None:
        if not self.enabled:
            return
        with self._lock:
            if len(self.records) == self.records.maxlen:
                self._by_step.pop(self.records[0].step, None)
            self.records.append(record)
            self._by_step[record.step] = record

    def sent(self, step: int, seconds: float, wire_bytes: int = 0, cpu_seconds: float = 0.0) -> None:
        with self._lock:
            rec = self._by_step.get(step)
            if rec is not None:
                rec.send_ms += seconds * 1000
                rec.send_cpu_ms += cpu_seconds * 1000
                rec.wire_bytes += wire_bytes

    def write(self) -> Path | None:
        directory = os.environ.get(PROFILE_DIR_ENV)
        if not self.enabled or not directory:
            return None
        path = Path(directory) / f"stage{self.stage_id}-{os.getpid()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            fields = list(StepRecord.__struct_fields__)
            rows = [msgspec.to_builtins(r) for r in self.records]
        path.write_text(
            json.dumps({"stage_id": self.stage_id, "written": time.time(), "fields": fields, "steps": rows})
        )
        return path


class StageCounters:
    """Request counts and running totals of one stage run: written by the engine thread (steps,
    requests) and the output thread (bytes), read by the heartbeat thread as a `StageStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = self._waiting = self._steps = 0
        self._step_s = 0.0
        self._bytes: dict[int, int] = {}  # downstream stage id -> wire bytes

    def requests(self, running: int, waiting: int) -> None:
        with self._lock:
            self._running, self._waiting = running, waiting

    def stepped(self, seconds: float) -> None:
        with self._lock:
            self._steps += 1
            self._step_s += seconds

    def sent(self, per_link: dict[int, int]) -> None:
        with self._lock:
            for stage_id, n in per_link.items():
                self._bytes[stage_id] = self._bytes.get(stage_id, 0) + n

    def snapshot(self) -> StageStats:
        with self._lock:
            return StageStats(
                running=self._running,
                waiting=self._waiting,
                steps=self._steps,
                step_seconds=self._step_s,
                sent=[LinkBytes(stage_id=sid, nbytes=n) for sid, n in sorted(self._bytes.items())],
            )

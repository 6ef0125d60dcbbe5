"""The coordinator: spawns the stage processes, routes requests, owns every request's fate.

Control plane only: stage-to-stage data flows directly between stage processes; the
coordinator sends registrations/aborts to stages, receives their events (ready, heartbeat,
final-stage chunks, per-stage done, errors) and talks to clients over a ROUTER socket.

Invariant: every submitted request gets exactly one terminal event (`Finished` or
`ErrorEvent`), whatever the stages do: errors, deadlines, aborts and dead stages all end in
`_finish_with_error`, which drops the request from the in-flight table first, so a second
terminal event cannot be produced.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq

from omni_mp.audio import AUDIO_KEY, AudioParts
from omni_mp.config import PipelineConfig
from omni_mp.control.endpoints import CONTROL_HWM, RunEndpoints, new_run_id
from omni_mp.control.stage_handle import StageHandle
from omni_mp.wire.payload import (
    Abort,
    Connect,
    Connected,
    ErrorEvent,
    Finished,
    Heartbeat,
    Message,
    PayloadError,
    Ready,
    Shutdown,
    StageDone,
    StageEndpoint,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
    StageResult,
    StageStatus,
    StatusReply,
    StatusRequest,
    Submit,
    decode,
)
from omni_mp.wire.transport import MessageReceiver, MessageSender, make_socket, send_message

log = logging.getLogger("omni_mp.control.coordinator")

POLL_MS = 100  # loop tick: bounds how late a death, deadline or heartbeat loss is noticed
# Sends to a stage wait at most this long for queue space; a stage that stays full this long
# is hung, and the heartbeat watch deals with it.
STAGE_SEND_TIMEOUT_S = 5.0


class StartupError(RuntimeError):
    """A stage failed to become ready; the message names the stage, why, and its last log lines."""


@dataclass
class Inflight:
    client: bytes
    request_id: str  # the client's id
    internal_id: str  # unique per submission: a reused client id never meets stale stage state
    stream: bool
    deadline: float | None
    t_submit: float
    pending_final: set[int]
    results: dict[int, StageResult] = field(default_factory=dict)
    done: dict[int, StageDone] = field(default_factory=dict)
    audio: dict[int, AudioParts] = field(default_factory=dict)  # final stages' audio chunks


class Coordinator:
    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        client_bind: str | None = None,
        log_dir: Path | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_id = new_run_id()
        self.endpoints = RunEndpoints(cfg.endpoints, self.run_id)
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"{self.run_id}-logs-")) if log_dir is None else log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress or (lambda msg: log.info("%s", msg))
        self.ctx = zmq.Context()
        self.events = MessageReceiver(self.ctx, self.endpoints.events(), cfg.limits, accept_shm=False, hwm=CONTROL_HWM)
        events_endpoint = self.events.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.client_sock = make_socket(self.ctx, zmq.ROUTER, cfg.limits, hwm=CONTROL_HWM)
        self.client_sock.bind(client_bind or self.endpoints.client())
        self.client_endpoint = self.client_sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stages = {
            s.id: StageHandle(cfg, s, events_endpoint, self.endpoints.stage_input(s.id), self.log_dir)
            for s in cfg.stages
        }
        self.stage_links: dict[int, MessageSender] = {}
        self.restart_at: dict[int, float] = {}
        self.inflight: dict[str, Inflight] = {}
        self.by_client: dict[tuple[bytes, str], str] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._closed = False

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn every stage at once (engine inits overlap) and wait for all to be ready."""
        t0 = time.monotonic()
        for h in self.stages.values():
            h.spawn()
            self.progress(f"stage {h.stage.id}: starting {h.stage.kind} engine ({h.stage.model}), pid {h.pid}")
        deadline = t0 + self.cfg.timeouts.stage_startup_s
        try:
            while not all(self._wired(h) for h in self.stages.values()):
                if self._stop.is_set():
                    raise StartupError("start-up interrupted")
                for h in self.stages.values():
                    code = h.exit_code()
                    if code is not None:
                        raise StartupError(
                            f"stage {h.stage.id} exited with code {code} before it was ready; "
                            f"last lines of {h.log_path}:\n{h.last_log_lines()}"
                        )
                if time.monotonic() > deadline:
                    late = [h for h in self.stages.values() if not self._wired(h)]
                    raise StartupError(
                        f"stage {late[0].stage.id} not ready after {self.cfg.timeouts.stage_startup_s:.0f}s; "
                        f"last lines of {late[0].log_path}:\n{late[0].last_log_lines()}"
                    )
                if self.events.socket.poll(POLL_MS):
                    self._drain_events()
        except BaseException:
            self.shutdown()
            raise
        self.progress(f"pipeline {self.cfg.name!r}: {len(self.stages)} stage(s) ready in {time.monotonic() - t0:.1f}s")

    def _wired(self, h: StageHandle) -> bool:
        """Ready, and its links to every downstream stage's current address are open."""
        if not h.ready:
            return False
        for d in self.cfg.downstream(h.stage.id):
            endpoint = self.stages[d].bound_endpoint
            if endpoint is None or h.connected.get(d) != endpoint:
                return False
        return True

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Serve until `stop()`; then shut everything down."""
        poller = zmq.Poller()
        poller.register(self.events.socket, zmq.POLLIN)
        poller.register(self.client_sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if self.events.socket in ready:
                    self._drain_events()
                if self.client_sock in ready:
                    self._drain_clients()
                now = time.monotonic()
                self._watch_stages(now)
                self._expire(time.time())
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for rid in list(self.inflight):
            self._finish_with_error(rid, "shutdown", "the pipeline is shutting down", None)
        for sid, h in self.stages.items():
            if sid in self.stage_links and h.is_alive():
                self._to_stage(sid, Shutdown(reason="coordinator shutdown"))
        for h in self.stages.values():
            if not h.wait(10.0):
                h.terminate(5.0)
        self.events.close()
        for link in self.stage_links.values():
            link.socket.close(linger=0)  # the stages are gone: nothing left to deliver
        self.client_sock.close(linger=500)  # let the last terminal events reach clients
        self.ctx.term()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    # ---- stage events -------------------------------------------------------------------------
    def _drain_events(self) -> None:
        while True:
            try:
                msg = self.events.recv(timeout=0)
            except TimeoutError:
                return
            except PayloadError as err:
                log.error("dropped an invalid stage event: %s", err)
                if err.request_id is not None:
                    self._finish_with_error(err.request_id, "invalid_payload", str(err), None)
                continue
            self._on_event(msg)

    def _on_event(self, msg: Message) -> None:
        if isinstance(msg, StageOutputBatch):
            try:
                chunks = msg.unpacked()
            except PayloadError as err:  # the requests it names end with the reason
                for chunk in msg.chunks:
                    self._finish_with_error(chunk.request_id, "invalid_payload", str(err), msg.chunks[0].stage_id)
                return
            for chunk in chunks:
                self._on_final_chunk(chunk)
        elif isinstance(msg, StageDone):
            self._on_stage_done(msg)
        elif isinstance(msg, ErrorEvent):
            self._finish_with_error(msg.request_id, msg.code, msg.message, msg.stage_id)
        elif isinstance(msg, Heartbeat):
            h = self.stages.get(msg.stage_id)
            if h is not None:
                h.last_heartbeat = time.monotonic()
        elif isinstance(msg, Ready):
            self._on_ready(msg)
        elif isinstance(msg, Connected):
            h = self.stages.get(msg.stage_id)
            if h is not None:
                h.connected.update({d.stage_id: d.endpoint for d in msg.downstream})
        else:
            log.warning("unexpected stage event %s", type(msg).__name__)

    def _on_ready(self, msg: Ready) -> None:
        h = self.stages.get(msg.stage_id)
        if h is None or h.pid != msg.pid:
            return  # a late message from a previous incarnation
        h.ready = True
        h.bound_endpoint = msg.info["input"]
        h.info = dict(msg.info)
        h.last_heartbeat = time.monotonic()
        old = self.stage_links.pop(h.stage.id, None)
        if old is not None:
            old.socket.close(linger=0)
        self.stage_links[h.stage.id] = MessageSender(self.ctx, h.bound_endpoint, self.cfg.limits, hwm=CONTROL_HWM)
        self.progress(
            f"stage {h.stage.id}: ready in {msg.info.get('init_s', '?')}s (pid {msg.pid}, restarts {h.restarts})"
        )
        # Wire it to its downstream stages, and its upstream stages to it (its address may be new).
        self._send_connect(h.stage.id)
        for up in h.stage.inputs:
            self._send_connect(up)

    def _send_connect(self, stage_id: int) -> None:
        downstream = [
            StageEndpoint(stage_id=d, endpoint=ep)
            for d in self.cfg.downstream(stage_id)
            if (ep := self.stages[d].bound_endpoint) is not None
        ]
        if downstream:
            self._to_stage(stage_id, Connect(downstream=downstream))

    def _to_stage(self, stage_id: int, msg: Message) -> bool:
        """Send to a stage; False if it is not connected or its queue stayed full (it is hung)."""
        link = self.stage_links.get(stage_id)
        if link is None:
            return False
        try:
            link.send(msg, timeout=STAGE_SEND_TIMEOUT_S)
        except TimeoutError:
            log.error("stage %d: input queue full for %.0fs; message dropped", stage_id, STAGE_SEND_TIMEOUT_S)
            return False
        return True

    def _on_final_chunk(self, chunk: StageOutputChunk) -> None:
        req = self.inflight.get(chunk.request_id)
        if req is None:
            return
        res = req.results.setdefault(chunk.stage_id, StageResult(stage_id=chunk.stage_id))
        res.token_ids.extend(chunk.token_ids)
        if chunk.additional_information and AUDIO_KEY in chunk.additional_information:
            try:
                req.audio.setdefault(chunk.stage_id, AudioParts(self.cfg.limits.max_tensor_bytes)).add(
                    chunk.additional_information
                )
            except ValueError as err:
                self._finish_with_error(req.internal_id, "invalid_output", str(err), chunk.stage_id)
                return
        if chunk.finished:
            res.text = chunk.text
            res.finish_reason = chunk.finish_reason
        if req.stream:  # as the stage sent it (hidden states included), under the client's id
            self._to_client(req.client, msgspec.structs.replace(chunk, request_id=req.request_id))

    def _on_stage_done(self, done: StageDone) -> None:
        req = self.inflight.get(done.request_id)
        if req is None:
            return
        req.done[done.stage_id] = done
        req.pending_final.discard(done.stage_id)
        if req.pending_final:
            return
        del self.inflight[req.internal_id]
        self.by_client.pop((req.client, req.request_id), None)
        results = []
        for sid in sorted(req.results):
            res = req.results[sid]
            d = req.done.get(sid)
            if d is not None:
                res.num_prompt_tokens = d.num_prompt_tokens
            if sid in req.audio:
                res.audio, res.sample_rate = req.audio[sid].joined(), req.audio[sid].sample_rate
            results.append(res)
        self._to_client(
            req.client,
            Finished(
                request_id=req.request_id,
                outputs=results,
                stage_timings=[req.done[s] for s in sorted(req.done)],
                t_submit=req.t_submit,
                t_finished=time.time(),
            ),
        )

    # ---- clients ------------------------------------------------------------------------------
    def _to_client(self, client: bytes, msg: Message) -> None:
        # A ROUTER drops what it cannot deliver (client gone or its queue full): never blocks.
        try:
            send_message(self.client_sock, msg, self.cfg.limits, routing_id=client, timeout=0)
        except TimeoutError:
            log.warning("dropped a %s for an unreachable client", type(msg).__name__)

    def _drain_clients(self) -> None:
        while True:
            try:
                frames = self.client_sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            client = frames[0].bytes
            try:
                msg = decode(frames[1:], self.cfg.limits)
            except PayloadError as err:
                self._to_client(
                    client,
                    ErrorEvent(request_id=err.request_id, stage_id=None, code="invalid_message", message=str(err)),
                )
                continue
            if isinstance(msg, Submit):
                self._on_submit(client, msg)
            elif isinstance(msg, Abort):
                internal = self.by_client.get((client, msg.request_id))
                if internal is not None:
                    self._finish_with_error(internal, "aborted", msg.reason or "aborted by the client", None)
            elif isinstance(msg, StatusRequest):
                self._to_client(client, self._status())
            else:
                self._to_client(
                    client,
                    ErrorEvent(
                        request_id=None,
                        stage_id=None,
                        code="invalid_message",
                        message=f"unexpected {type(msg).__name__}",
                    ),
                )

    def _status(self) -> StatusReply:
        return StatusReply(
            pipeline=self.cfg.name,
            stages=[
                StageStatus(
                    stage_id=sid,
                    pid=h.pid or 0,
                    alive=h.is_alive(),
                    ready=self._wired(h),
                    restarts=h.restarts,
                    info=h.info,
                )
                for sid, h in self.stages.items()
            ],
            inflight=len(self.inflight),
        )

    def _on_submit(self, client: bytes, msg: Submit) -> None:
        def reject(code: str, message: str) -> None:
            self._to_client(client, ErrorEvent(request_id=msg.request_id, stage_id=None, code=code, message=message))

        if (client, msg.request_id) in self.by_client:
            return reject("duplicate_request", f"request id {msg.request_id!r} is already in flight")
        if sum(x is not None for x in (msg.prompt, msg.prompt_token_ids, msg.prompt_embeds)) != 1:
            return reject("invalid_input", "give exactly one of `prompt`, `prompt_token_ids` and `prompt_embeds`")
        if msg.prompt_embeds is not None and not all(s.prompt_embeds for s in self.cfg.entry_stages):
            return reject(
                "invalid_input", "`prompt_embeds`: the entry stage does not take embeddings (set `prompt_embeds: true`)"
            )
        sampling = {s.stage_id: s.params for s in msg.sampling}
        for sid in sampling:
            if sid not in self.stages:
                return reject("invalid_input", f"`sampling`: unknown stage id {sid}")
        down = [sid for sid, h in self.stages.items() if not self._wired(h)]
        if down:
            return reject("stage_unavailable", f"stage(s) {down} are not ready (restarting or failed)")
        now = time.time()
        deadline_s = msg.deadline_s if msg.deadline_s is not None else self.cfg.timeouts.default_deadline_s
        if deadline_s is not None and deadline_s <= 0:
            return reject("invalid_input", f"`deadline_s` must be > 0, got {deadline_s}")
        # Stages see only this id: unique per submission, whatever the client's id is.
        internal = f"q{next(self._ids)}"
        req = Inflight(
            client=client,
            request_id=msg.request_id,
            internal_id=internal,
            stream=msg.stream,
            deadline=None if deadline_s is None else now + deadline_s,
            t_submit=now,
            pending_final={s.id for s in self.cfg.final_stages},
        )
        self.inflight[internal] = req
        self.by_client[(client, msg.request_id)] = internal
        # Register with downstream stages first, so their upstream data rarely has to wait.
        for stage in sorted(self.cfg.stages, key=lambda s: not s.inputs):
            entry = not stage.inputs
            sent = self._to_stage(
                stage.id,
                StageRequest(
                    request_id=internal,
                    stage_id=stage.id,
                    prompt=msg.prompt if entry else None,
                    prompt_token_ids=msg.prompt_token_ids if entry else None,
                    prompt_embeds=msg.prompt_embeds if entry else None,
                    sampling_params=sampling.get(stage.id, stage.sampling),
                    deadline=req.deadline,
                ),
            )
            if not sent:  # a registration lost would leave the request waiting forever
                self._finish_with_error(internal, "stage_unavailable", f"stage {stage.id} is not accepting work", None)
                return

    # ---- failures -----------------------------------------------------------------------------
    def _finish_with_error(self, internal_id: str, code: str, message: str, stage_id: int | None) -> None:
        req = self.inflight.pop(internal_id, None)
        if req is None:
            return  # already terminal
        self.by_client.pop((req.client, req.request_id), None)
        for sid in self.stage_links:
            if self.stages[sid].is_alive():
                self._to_stage(sid, Abort(request_id=internal_id, reason=code))
        self._to_client(
            req.client, ErrorEvent(request_id=req.request_id, stage_id=stage_id, code=code, message=message)
        )

    def _expire(self, now: float) -> None:
        for rid, req in list(self.inflight.items()):
            if req.deadline is not None and now >= req.deadline:
                allowed = req.deadline - req.t_submit
                self._finish_with_error(rid, "deadline_exceeded", f"deadline of {allowed:.3f}s exceeded", None)

    def _watch_stages(self, now: float) -> None:
        for sid, h in self.stages.items():
            if sid in self.restart_at:
                if now >= self.restart_at[sid]:
                    del self.restart_at[sid]
                    h.restarts += 1
                    h.spawn()
                    self.progress(f"stage {sid}: restarting (restart {h.restarts}), pid {h.pid}")
                continue
            code = h.exit_code()
            if code is None and h.ready and now - h.last_heartbeat > self.cfg.timeouts.heartbeat_timeout_s:
                log.error("stage %d: no heartbeat for %.1fs; killing it", sid, now - h.last_heartbeat)
                h.kill()
                code = h.exit_code()
            if code is not None and h.proc is not None:
                self._on_stage_death(sid, code, now)

    def _on_stage_death(self, sid: int, code: int, now: float) -> None:
        h = self.stages[sid]
        tail = h.last_log_lines(5).strip().splitlines()
        reason = f"stage {sid} (pid {h.pid}) died with exit code {code}" + (
            f"; last log line: {tail[-1]}" if tail else ""
        )
        log.error("%s", reason)
        h.proc = None
        h.ready = False
        h.bound_endpoint = None
        link = self.stage_links.pop(sid, None)
        if link is not None:
            link.socket.close(linger=0)
        # Every in-flight request may hold state in the dead stage (registrations go to all).
        for rid in list(self.inflight):
            self._finish_with_error(rid, "stage_died", reason, sid)
        policy = h.stage.restart
        if h.restarts < policy.max_restarts:
            self.restart_at[sid] = now + policy.backoff_s * (2 ** min(h.restarts, 6))
        else:
            self.progress(f"stage {sid}: died and will not be restarted (max_restarts {policy.max_restarts})")

"""The coordinator: spawns the stage processes, routes requests, owns every request's fate.

Control plane only: stage-to-stage data flows directly between stage processes; the
coordinator sends registrations/aborts to stages, receives their events (ready, heartbeat,
final-stage chunks, per-stage done, errors) and talks to clients over a ROUTER socket.

This module is the loop and the client protocol; the parts it drives are small and tested
on their own: `requests` (the request table and admission checks), `router` (which replica
of each stage a request is bound to), `supervisor` (stage processes: deaths, hangs,
restarts), `wiring` (which stage links are open) and `links` (outgoing sockets that never
block the loop). Every stage process is one replica of a stage (`ReplicaKey`); a stage of
one replica is the common case, and a replica that dies fails only the requests bound to it.

Invariant: every submitted request gets exactly one terminal event (`Finished` or
`ErrorEvent`), whatever the stages do: errors, deadlines, aborts, dead stages and gone
clients all end in `_finish_with_error`, which removes the request from the table first,
so a second terminal event cannot be produced. Rejections of a message that cannot start a
request (a duplicate id, an invalid message naming an id in flight) carry no request id, so
they never look like the end of the request in flight.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from omni_mp.config.schema import PipelineConfig
from omni_mp.config.validate import check_models
from omni_mp.control.endpoints import RunEndpoints, new_run_id
from omni_mp.control.links import ClientPort, StageLink
from omni_mp.control.memory_budget import resolve_memory_budgets
from omni_mp.control.mps import MpsDaemon, MpsUnavailable, plan_sharing
from omni_mp.control.ray_placement import RayPlacement
from omni_mp.control.requests import Inflight, Rejected, RequestTable, check_submit, request_stages
from omni_mp.control.router import NoReplica, ReplicaKey, Router
from omni_mp.control.stage_handle import StageHandle
from omni_mp.control.supervisor import Supervisor
from omni_mp.control.wiring import Wiring
from omni_mp.media.limits import resolve_media_limits
from omni_mp.models.registry import processor_traits
from omni_mp.utils.devices import visible_entries
from omni_mp.wire.codec import PayloadError
from omni_mp.wire.keys import CLIENT_DOMAIN, STAGE_DOMAIN, SecureContext, pipeline_identity
from omni_mp.wire.messages import (
    Abort,
    BoundReplica,
    Connected,
    ErrorEvent,
    Finished,
    Heartbeat,
    Message,
    Ready,
    SamplingParamsMsg,
    Shutdown,
    StageDone,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
    StageResult,
    StageStatus,
    StatusReply,
    StatusRequest,
    Submit,
)
from omni_mp.wire.outputs import AUDIO_KEY, IMAGE_KEY, AudioParts, FinalImage
from omni_mp.wire.transport import CONTROL_HWM, MessageReceiver, MessageSender

log = logging.getLogger("omni_mp.control.coordinator")

POLL_MS = 100  # loop tick: bounds how late a death, deadline or heartbeat loss is noticed
BUSY_POLL_MS = 5  # the tick while outgoing messages wait for room
# Messages handled per socket per turn: a flood on one socket cannot starve the other.
DRAIN_BATCH = 512
# The error code of a request whose message (prompt or output) breaks the wire limits.
LIMIT_EXCEEDED = "limit_exceeded"


class StartupError(RuntimeError):
    """A stage failed to become ready; the message names the stage, why, and its last log lines."""


class Coordinator:
    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        client_bind: str | None = None,
        log_dir: Path | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        # Before anything is bound or spawned: a model that is not here, or a budget that cannot
        # fit, fails now (ValueErrors naming the stage and every number), not in a stage.
        check_models(cfg)
        if cfg.placement.kind == "local":  # every replica's GPUs among the ones the caller sees
            for r, s in cfg.replica_stages():
                visible_entries(s.devices, os.environ, f"stage {s.id}" + (f" replica {r}" if s.replicas > 1 else ""))
        # Entry stages' media limits resolved from their checkpoints (the stages get them too).
        self.cfg = cfg = resolve_media_limits(resolve_memory_budgets(cfg, progress=progress))
        self.run_id = new_run_id()
        self.endpoints = RunEndpoints(cfg.endpoints, self.run_id)
        bind = client_bind or self.endpoints.client()
        self.curve = None if cfg.security.keys is None else pipeline_identity(cfg.security.keys)
        if self.curve is None and not bind.startswith("ipc://"):
            raise ValueError(
                f"client endpoint {bind}: tcp needs CURVE keys. Create them with `omni-mp keys DIR --client NAME`, "
                "set `security: {keys: DIR}` in the pipeline YAML, and give clients DIR/NAME's keys "
                "(or serve on an ipc:// endpoint, which needs none)"
            )
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"{self.run_id}-logs-")) if log_dir is None else log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress or (lambda msg: log.info("%s", msg))
        self.ctx = SecureContext()
        self.ctx.curve = self.curve
        domains = (CLIENT_DOMAIN, STAGE_DOMAIN)
        self._auth = None if self.curve is None else self.curve.start_authenticator(self.ctx, domains)
        self.events = MessageReceiver(self.ctx, self.endpoints.events(), cfg.limits, accept_shm=False, hwm=CONTROL_HWM)
        events_endpoint = self.events.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        adm = cfg.admission
        self.clients = ClientPort(self.ctx, bind, cfg.limits, adm.client_queue, self.curve, adm.max_inflight)
        self.client_endpoint = self.clients.endpoint
        self.ray: RayPlacement | None = None
        if cfg.placement.kind == "ray":
            self.ray = RayPlacement(cfg, self.run_id)
        self.stages = {
            ReplicaKey(s.id, r): StageHandle(cfg, s, events_endpoint, self.endpoints, self.log_dir, self.ray, r)
            for s in cfg.stages
            for r in range(s.replicas)
        }
        self.sharing = plan_sharing(cfg)
        self.mps: MpsDaemon | None = None  # the private MPS daemon of this run, while it runs
        self.sharing_note = f"time-slicing ({self.sharing.why})"  # what the stages on shared GPUs do
        self.supervisor = Supervisor(cfg, self.stages, self.progress)
        self.wiring = Wiring(cfg, self.stages)
        self.table = RequestTable(cfg.admission.max_inflight)
        self.links: dict[ReplicaKey, StageLink] = {}
        self.router = Router(cfg, self._usable, self.wiring.linked, self._heartbeat_load)
        self._final = {s.id for s in cfg.final_stages}
        # Registration order: downstream stages first, so their upstream data rarely has to wait.
        self._register_order = sorted(cfg.stages, key=lambda s: not s.inputs)
        # The stages fed by each stage (StageRequest.rows_wanted: who may read its hidden rows).
        self._readers = {s.id: set(cfg.downstream(s.id)) for s in cfg.stages}
        # Of those, the ones that read its prompt's rows only at media placeholders.
        self._media_readers = {
            s.id: {d for d in self._readers[s.id] if _reads_media_rows_only(cfg.stage(d).processor)} for s in cfg.stages
        }
        self._stop = threading.Event()
        self._closed = False

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn every stage at once (engine inits overlap) and wait for all to be wired."""
        t0 = time.monotonic()
        if self.ray is not None:  # every stage's bundle reserved (GPUs included) before any starts
            try:
                self.ray.wait_placed(self.cfg.timeouts.stage_startup_s)
            except BaseException:
                self.shutdown()
                raise
            self.progress(f"ray: {len(self.stages)} bundle(s) placed")
        try:
            self._share_gpus()
        except BaseException:
            self.shutdown()
            raise
        for h in self.stages.values():
            h.spawn()
            self.progress(f"{h.name}: starting {h.stage.kind} engine ({h.stage.model}), pid {h.pid}")
        # Tensors in messages are decoded as torch tensors (omni_mp.wire.codec): torch is
        # imported now, while the stages start, not by the first request that carries media
        # (seconds on its path, the coordinator's loop stalled meanwhile).
        import torch  # noqa: F401

        try:
            self._wait_wired(t0 + self.cfg.timeouts.stage_startup_s)
        except BaseException:
            self.shutdown()
            raise
        late = self.wiring.not_wired()
        what = f"{len(self.stages) - len(late)} of {len(self.stages)} stage process(es)" if late else None
        what = what or f"{len(self.stages)} stage(s)"
        self.progress(f"pipeline {self.cfg.name!r}: {what} ready in {time.monotonic() - t0:.1f}s")

    def _wait_wired(self, deadline: float) -> None:
        """Until every stage process is ready and linked; at `deadline`, a replica still not
        ready holds back no more: the pipeline serves if every stage has a serving replica
        (the supervisor deals with the late one as with any replica that hangs at start)."""
        while late := self.wiring.not_wired():
            if self._stop.is_set():
                raise StartupError("start-up interrupted")
            for h in self.stages.values():
                code = h.exit_code()
                if code is not None:
                    raise StartupError(
                        f"{h.name} exited with code {code} before it was ready; "
                        f"last lines of {h.log_path}:\n{h.last_log_lines()}"
                    )
            if time.monotonic() > deadline:
                if not self.wiring.stages_down():
                    names = ", ".join(self.stages[k].name for k in late)
                    self.progress(f"{names}: not ready after {self.cfg.timeouts.stage_startup_s:.0f}s; serving without")
                    return
                h = self.stages[late[0]]
                raise StartupError(
                    f"{h.name} not ready after {self.cfg.timeouts.stage_startup_s:.0f}s; "
                    f"last lines of {h.log_path}:\n{h.last_log_lines()}"
                )
            if self.events.socket.poll(POLL_MS):
                self._drain_events()
            self._flush()

    def _share_gpus(self) -> None:
        """Before any stage starts: make the stages that share a GPU clients of an MPS daemon
        (omni_mp.control.mps), the host's or one of our own, as `gpu_sharing` says."""
        plan, mode = self.sharing, self.cfg.gpu_sharing.mode
        if not plan.stages:
            if mode != "auto" or any(s.devices for _, s in self.cfg.replica_stages()):
                self.progress(f"gpu sharing: {self.sharing_note}")
            return
        pipe = plan.host_pipe
        if plan.needs_daemon:
            try:
                self.mps = MpsDaemon.start(self.log_dir / "mps_guard.log")
            except MpsUnavailable as err:
                if mode == "mps":
                    raise StartupError(f"gpu_sharing: mps: {err}") from None
                self.sharing_note = f"time-slicing ({plan.why}); no MPS: {err}"
                self.progress(f"gpu sharing: {self.sharing_note}")
                return
            pipe, whose = self.mps.pipe, f"a private MPS daemon (guard pid {self.mps.guard.pid})"
        else:
            whose = f"the host's MPS daemon ({pipe})"
        self._use_mps(pipe)
        self.sharing_note = f"MPS through {whose} ({plan.why})"
        self.progress(f"gpu sharing: {self.sharing_note}")

    def _use_mps(self, pipe: str | None) -> None:
        """Stages on shared GPUs start as clients of the daemon at `pipe` (None: of none)."""
        for key, h in self.stages.items():
            if key.stage_id in self.sharing.stages:
                h.mps_pipe = pipe

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Serve until `stop()`; then shut everything down."""
        poller = zmq.Poller()
        poller.register(self.events.socket, zmq.POLLIN)
        poller.register(self.clients.socket, zmq.POLLIN)
        poller.register(self.clients.monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                busy = self.clients.pending() or any(link.pending() for link in self.links.values())
                ready = dict(poller.poll(BUSY_POLL_MS if busy else POLL_MS))
                if self.events.socket in ready:
                    self._drain_events()
                if self.clients.socket in ready:
                    self._drain_clients()
                self._flush()
                self._supervise(time.monotonic())
                self._expire(time.time())
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for rid in self.table.ids():
            self._finish_with_error(rid, "shutdown", "the pipeline is shutting down", None)
        for key, link in self.links.items():
            if self.stages[key].is_alive():
                link.send_control(Shutdown(reason="coordinator shutdown"))
        deadline = time.monotonic() + 2.0  # bounded: a hung stage is terminated below anyway
        while any(link.pending() for link in self.links.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
            self._flush()
        for h in self.stages.values():
            if not h.wait(10.0):
                h.terminate(5.0)
        if self.ray is not None:
            self.ray.close()
        if self.mps is not None:  # after its clients are gone
            self.mps.stop()
            self.mps = None
        self.events.close()
        for link in self.links.values():
            link.close()  # the stages are gone: nothing left to deliver
        self.clients.close(linger_ms=500)  # let the last terminal events reach clients
        if self._auth is not None:
            self._auth.stop()
        self.ctx.term()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _flush(self) -> None:
        for link in self.links.values():
            link.flush()
        self.clients.flush()
        for client in self.clients.disconnected():
            self._client_gone(client)

    def _supervise(self, now: float) -> None:
        if self.mps is not None and not self.mps.alive():
            # Stages (re)started from now on find no daemon and run time-sliced: CUDA runs a
            # program without MPS when it cannot reach a daemon.
            self.sharing_note = f"time-slicing: the MPS daemon's guard exited (code {self.mps.guard.returncode})"
            self.progress(f"gpu sharing: {self.sharing_note}")
            self.mps.stop()
            self.mps = None
            self._use_mps(None)
        stalled = {key for key, link in self.links.items() if link.stalled()}
        for key, reason in self.supervisor.check(now, stalled):
            link = self.links.pop(key, None)
            if link is not None:
                link.close()
            # The requests bound to the dead replica end; the other replicas' go on.
            for rid in self.table.bound_to(key.stage_id, key.replica):
                self._finish_with_error(rid, "stage_died", reason, key.stage_id)

    # ---- stage events -------------------------------------------------------------------------
    def _drain_events(self) -> None:
        for _ in range(DRAIN_BATCH):
            try:
                msg = self.events.recv(timeout=0)
            except TimeoutError:
                return
            except PayloadError as err:
                log.error("dropped an invalid stage event: %s", err)
                if err.request_id is not None:
                    self._finish_with_error(err.request_id, "invalid_payload", str(err), None)
                continue
            try:
                self._on_event(msg)
            except Exception:  # one bad event must not take the pipeline down
                log.exception("could not handle a %s from a stage", type(msg).__name__)

    def _on_event(self, msg: Message) -> None:
        if isinstance(msg, StageOutputBatch):
            try:
                chunks = msg.unpacked()
            except PayloadError as err:  # the requests it names end with the reason
                for chunk in msg.chunks:
                    self._finish_with_error(chunk.request_id, "invalid_payload", str(err), chunk.stage_id)
                return
            for chunk in chunks:
                self._on_final_chunk(chunk)
        elif isinstance(msg, StageDone):
            self._on_stage_done(msg)
        elif isinstance(msg, ErrorEvent):
            if msg.request_id is not None:
                self._finish_with_error(msg.request_id, msg.code, msg.message, msg.stage_id)
        elif isinstance(msg, Heartbeat):
            self.supervisor.heartbeat(ReplicaKey(msg.stage_id, msg.replica), time.monotonic(), msg.stats)
        elif isinstance(msg, Ready):
            self._on_ready(msg)
        elif isinstance(msg, Connected):
            self.wiring.on_connected(ReplicaKey(msg.stage_id, msg.replica), msg.downstream)
        else:
            log.warning("unexpected stage event %s", type(msg).__name__)

    def _on_ready(self, msg: Ready) -> None:
        key = ReplicaKey(msg.stage_id, msg.replica)
        h = self.stages.get(key)
        if h is None or h.pid != msg.pid or h.ready:
            return  # a late or repeated message, or one from a previous incarnation
        endpoint = msg.info.get("input", "")
        if not endpoint.startswith(("ipc://", "tcp://")):
            log.error("%s: ignored a Ready without a valid info['input'] (got %r)", h.name, endpoint)
            return
        h.became_ready(endpoint, dict(msg.info), time.monotonic())
        sender = MessageSender(self.ctx, endpoint, self.cfg.limits, hwm=CONTROL_HWM)
        old = self.links.pop(key, None)
        if old is not None:
            old.close()
        self.links[key] = StageLink(sender, self.cfg.limits, self.cfg.admission.stage_queue)
        warm = "".join(f"; {msg.info[k]}" for k in ("warmup", "gpu_memory", "mps_share") if k in msg.info)
        self.progress(f"{h.name}: ready in {msg.info.get('init_s', '?')}s (pid {msg.pid}, restarts {h.restarts}{warm})")
        # Wire it to its downstream replicas, and its upstream replicas to it (its address is new).
        for target, connect in self.wiring.on_ready(key):
            self.links[target].send_control(connect)

    def _on_final_chunk(self, chunk: StageOutputChunk) -> None:
        req = self.table.get(chunk.request_id)
        if req is None:
            return
        res = req.results.setdefault(chunk.stage_id, StageResult(stage_id=chunk.stage_id))
        res.token_ids.extend(chunk.token_ids)
        info = chunk.additional_information
        if info and (AUDIO_KEY in info or IMAGE_KEY in info):
            max_bytes = self.cfg.limits.max_tensor_bytes
            try:
                if AUDIO_KEY in info:
                    req.audio.setdefault(chunk.stage_id, AudioParts(max_bytes)).add(info)
                if IMAGE_KEY in info:
                    req.image.setdefault(chunk.stage_id, FinalImage(max_bytes)).add(info)
            except ValueError as err:
                self._finish_with_error(req.internal_id, "invalid_output", str(err), chunk.stage_id)
                return
        if chunk.finished:
            res.text = chunk.text
            res.finish_reason = chunk.finish_reason
        if req.stream:  # as the stage sent it (hidden rows only if asked for), under the client's id
            try:
                sent = self.clients.send(
                    req.client, msgspec.structs.replace(chunk, request_id=req.request_id), droppable=True
                )
            except PayloadError as err:  # the request fails, not the coordinator
                self._finish_with_error(req.internal_id, LIMIT_EXCEEDED, f"its output could not be sent: {err}", None)
                return
            if sent == "full":
                limit = self.cfg.admission.client_queue
                message = f"the client reads its stream too slowly ({limit} messages waiting; admission.client_queue)"
                self._finish_with_error(req.internal_id, "slow_consumer", message, None)

    def _on_stage_done(self, done: StageDone) -> None:
        req = self.table.get(done.request_id)
        if req is None:
            return
        req.done[done.stage_id] = done
        self._release(req, done.stage_id)
        req.pending_final.discard(done.stage_id)
        if req.pending_final:
            return
        self._end(req.internal_id)
        # Stages still working on it (a final stage may end before its upstream) stop now.
        for key in self._bound(req):
            if key.stage_id not in req.done:
                self.links[key].abort(req.internal_id, Abort(request_id=req.internal_id, reason="finished downstream"))
        results = []
        for sid in sorted(req.results):
            res = req.results[sid]
            d = req.done.get(sid)
            if d is not None:
                res.num_prompt_tokens = d.num_prompt_tokens
            if sid in req.audio:
                res.audio, res.sample_rate = req.audio[sid].joined(), req.audio[sid].sample_rate
            if sid in req.image:
                res.image = req.image[sid].pixels
            results.append(res)
        finished = Finished(
            request_id=req.request_id,
            outputs=results,
            stage_timings=[req.done[s] for s in sorted(req.done)],
            t_submit=req.t_submit,
            t_finished=time.time(),
        )
        self._to_client(req.client, finished)

    # ---- clients ------------------------------------------------------------------------------
    def _to_client(self, client: bytes, msg: Message) -> None:
        """An answer the client waits for: kept even when it reads slowly (a client found gone
        is handled with the disconnections, in _flush). One that cannot be encoded becomes
        an error event for its request."""
        try:
            self.clients.send(client, msg, droppable=False)
        except PayloadError as err:
            request_id = getattr(msg, "request_id", None)
            log.error("could not send a %s for request %s: %s", type(msg).__name__, request_id, err)
            if request_id is None or isinstance(msg, ErrorEvent | StatusReply):
                return  # not a request's answer, or already an error: it stays logged
            text = f"its {type(msg).__name__} could not be sent: {err}"[: self.cfg.limits.max_string_length]
            error = ErrorEvent(request_id=request_id, stage_id=None, code=LIMIT_EXCEEDED, message=text)
            self.clients.send(client, error, droppable=False)

    def _client_gone(self, client: bytes) -> None:
        for rid in self.table.of_client(client):
            self._finish_with_error(rid, "client_gone", "the client disconnected", None)

    def _drain_clients(self) -> None:
        for _ in range(DRAIN_BATCH):
            try:
                client, msg = self.clients.recv()
            except zmq.Again:
                return
            try:
                self._on_client_message(client, msg)
            except Exception:  # one bad message must not take the pipeline down
                log.exception("could not handle a %s from a client", type(msg).__name__)

    def _on_client_message(self, client: bytes, msg: Message | PayloadError) -> None:
        if isinstance(msg, PayloadError):
            self._reject(client, msg.request_id, "invalid_message", str(msg))
        elif isinstance(msg, Submit):
            self._on_submit(client, msg)
        elif isinstance(msg, Abort):
            req = self.table.lookup(client, msg.request_id)  # only the client's own requests
            if req is not None:
                self._finish_with_error(req.internal_id, "aborted", msg.reason or "aborted by the client", None)
        elif isinstance(msg, StatusRequest):
            self._to_client(client, self._status(msg.request_id))
        else:
            self._reject(client, None, "invalid_message", f"unexpected {type(msg).__name__}")

    def _reject(self, client: bytes, request_id: str | None, code: str, message: str) -> None:
        """Refuse a message. It carries `request_id` only if that id is not in flight for this
        client: the answer must not end (or seem to end) the request in flight."""
        if request_id is not None and self.table.lookup(client, request_id) is not None:
            message = f"request {request_id!r}: {message}"
            request_id = None
        self._to_client(client, ErrorEvent(request_id=request_id, stage_id=None, code=code, message=message))

    def _status(self, request_id: str | None) -> StatusReply:
        return StatusReply(
            pipeline=self.cfg.name,
            stages=[
                StageStatus(
                    stage_id=key.stage_id,
                    replica=key.replica,
                    pid=h.pid or 0,
                    alive=h.is_alive(),
                    ready=self.wiring.serving(key),
                    restarts=h.restarts,
                    failed=h.failure,
                    info={} if h.run is None else h.run.info,
                    stats=None if h.run is None else h.run.stats,
                )
                for key, h in self.stages.items()
            ],
            inflight=len(self.table),
            request_id=request_id,
        )

    def down_for_good(self) -> dict[int, str]:
        """Stages whose every replica died with its restart budget spent, and why: while there
        is one, no request can be served (a served pipeline then exits; omni_mp.cli)."""
        return self.supervisor.down_for_good()

    # ---- replicas -----------------------------------------------------------------------------
    def _usable(self, key: ReplicaKey) -> bool:
        """The router may bind a request to `key` now: it serves and its queue has room."""
        link = self.links.get(key)
        return link is not None and not link.full() and self.wiring.serving(key)

    def _serving(self, stage_id: int) -> list[ReplicaKey]:
        return [k for k in self.wiring.replicas(stage_id) if k in self.links and self.wiring.serving(k)]

    def _heartbeat_load(self, key: ReplicaKey) -> int:
        run = self.stages[key].run
        stats = None if run is None else run.stats
        return 0 if stats is None else stats.running + stats.waiting

    def _bound(self, req: Inflight) -> list[ReplicaKey]:
        return [ReplicaKey(sid, r) for sid, r in req.route.items() if ReplicaKey(sid, r) in self.links]

    def _release(self, req: Inflight, stage_id: int) -> None:
        """The request no longer counts as outstanding in its replica of `stage_id`."""
        if stage_id in req.route and stage_id not in req.released:
            req.released.add(stage_id)
            self.router.release(ReplicaKey(stage_id, req.route[stage_id]))

    def _end(self, internal_id: str) -> Inflight | None:
        """Take a request out of the table (it is ending; None if it already ended)."""
        req = self.table.pop(internal_id)
        if req is not None:
            for sid in list(req.route):
                self._release(req, sid)
        return req

    def _on_submit(self, client: bytes, msg: Submit) -> None:
        try:
            sampling = check_submit(self.cfg, msg)
            down = self.wiring.stages_down()
            if down:
                raise Rejected("stage_unavailable", f"stage(s) {down} are not ready (restarting or failed)")
            full = [s.id for s in self.cfg.stages if all(self.links[k].full() for k in self._serving(s.id))]
            if full:
                raise Rejected("overloaded", f"stage(s) {full} have a full queue; retry later")
            now, admitted = time.time(), time.monotonic()
            deadline_s = msg.deadline_s if msg.deadline_s is not None else self.cfg.timeouts.default_deadline_s
            finals = set(msg.final_stages) or self._final
            req = self.table.admit(client, msg, now, deadline_s, finals)
        except Rejected as err:
            return self._reject(client, msg.request_id, err.code, str(err))
        try:
            req.route = self.router.bind()
        except NoReplica as err:
            self.table.pop(req.internal_id)
            return self._reject(client, msg.request_id, "stage_unavailable", str(err))
        try:
            self._register(req, msg, sampling, None if deadline_s is None else admitted + deadline_s)
        except PayloadError as err:  # e.g. a prompt within the client's limits but not a stage's
            self._finish_with_error(req.internal_id, LIMIT_EXCEEDED, f"could not be sent to a stage: {err}", None)

    def _register(
        self, req: Inflight, msg: Submit, sampling: dict[int, SamplingParamsMsg], deadline_at: float | None
    ) -> None:
        """The request's stages get it (entry stages get its prompt) and the seconds left until
        `deadline_at` (time.monotonic()): every stage, or with `final_stages` those and the
        stages upstream of them."""
        runs = request_stages(self.cfg, set(msg.final_stages)) if msg.final_stages else set(req.route)
        for stage in self._register_order:
            link = self.links[ReplicaKey(stage.id, req.route[stage.id])]
            if stage.id not in runs:
                # Not on the way to a wanted output: never registered there, and what its
                # upstream still streams to it for this request is dropped on arrival.
                link.send_control(Abort(request_id=req.internal_id, reason="not a stage of this request"))
                self._release(req, stage.id)
                continue
            left = None if deadline_at is None else max(deadline_at - time.monotonic(), 0.0)
            entry = not stage.inputs
            to_client = msg.hidden_states and stage.final_output  # the client reads its rows too
            readers = self._readers[stage.id] & runs
            link.register(
                StageRequest(
                    request_id=req.internal_id,
                    stage_id=stage.id,
                    prompt=msg.prompt if entry else None,
                    prompt_token_ids=msg.prompt_token_ids if entry else None,
                    prompt_embeds=msg.prompt_embeds if entry else None,
                    multi_modal=msg.multi_modal if entry else None,
                    forced_reply=msg.forced_reply if entry else None,
                    chat_formatted=msg.chat_formatted and entry,
                    speaker=msg.speaker,
                    params=msg.params,
                    sampling_params=sampling.get(stage.id, stage.sampling),
                    deadline_s=left,
                    hidden_states=to_client,
                    downstream_replicas=[BoundReplica(d, req.route[d]) for d in self.cfg.downstream(stage.id)],
                    rows_wanted=to_client or bool(readers),
                    media_rows_only=not to_client and bool(readers) and readers <= self._media_readers[stage.id],
                )
            )

    # ---- failures -----------------------------------------------------------------------------
    def _finish_with_error(self, internal_id: str, code: str, message: str, stage_id: int | None) -> None:
        req = self._end(internal_id)
        if req is None:
            return  # already terminal
        for key in self._bound(req):  # the replicas it is bound to, none other
            self.links[key].abort(internal_id, Abort(request_id=internal_id, reason=code))
        error = ErrorEvent(request_id=req.request_id, stage_id=stage_id, code=code, message=message)
        self._to_client(req.client, error)

    def _expire(self, now: float) -> None:
        for req in self.table.expired(now):
            allowed = req.deadline - req.t_submit if req.deadline is not None else 0.0
            self._finish_with_error(req.internal_id, "deadline_exceeded", f"deadline of {allowed:.3f}s exceeded", None)


def _reads_media_rows_only(processor: str | None) -> bool:
    """Whether a stage's processor reads its upstream's prompt rows only at media placeholders."""
    return processor is not None and processor_traits(processor).prompt_rows == "media"

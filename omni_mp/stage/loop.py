"""The stage process main loop: the engine thread receives, adds to the engine, steps, and
hands each step's outputs to the output thread.

The engine thread owns the engine and the request table, and touches no socket: decoded
messages arrive through the `Inbox` (control first), outgoing messages leave through the
`OutputPump`, heartbeats come from the `Heartbeater` (see io_threads). Each iteration takes
what has arrived, runs one engine step over the whole batch when there is work, and queues
the step's outputs at once: downstream stages get every chunk, the coordinator gets the
chunks of final stages and a `StageDone` per finished request. Bad input for one request
becomes an `ErrorEvent` for that request; the loop keeps serving the others.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import msgspec
import zmq

from omni_mp.config.schema import PipelineConfig, StageConfig
from omni_mp.engines.base import EngineInputError, Extension, PreparedRequest, StageEngine
from omni_mp.models.processor import SILENT_REASON, ProcessorError, RequestContext, Silent
from omni_mp.models.registry import resolve_model, stage_processor
from omni_mp.stage.io_threads import Heartbeater, Inbox, InputError, InputPump, Outgoing, OutputPump
from omni_mp.stage.prepare import Prepared, PrepareJob, Preparer
from omni_mp.stage.requests import Arrival, EndedRequests, OrphanChunks, StageRequestState
from omni_mp.stage.timeline import StageCounters, StepRecord, StepTimeline
from omni_mp.stage.torch_profile import StepProfiler
from omni_mp.wire.codec import Limits, PayloadError
from omni_mp.wire.messages import (
    Abort,
    BoundReplica,
    Connect,
    ErrorEvent,
    Message,
    Shutdown,
    StageDone,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
)
from omni_mp.wire.shm_pool import ShmPoolConfig
from omni_mp.wire.transport import MessageReceiver, MessageSender

log = logging.getLogger("omni_mp.stage")

IDLE_WAIT_S = 0.05  # how long an idle engine thread waits for input before re-checking deadlines


class StageLoop:
    def __init__(
        self,
        cfg: PipelineConfig,
        stage: StageConfig,
        engine: StageEngine,
        ctx: zmq.Context,
        input_link: MessageReceiver,
        events: MessageSender,
        heartbeat_link: MessageSender,
        replica: int = 0,
    ) -> None:
        self.cfg = cfg
        self.stage = stage
        self.replica = replica
        self.downstream_ids = cfg.downstream(stage.id)
        self.engine = engine
        self.limits: Limits = cfg.limits
        self.processor = (
            stage_processor(stage.processor).bind(stage, resolve_model(stage.model)) if stage.processor else None
        )
        # The voices this stage can speak in (None: it does not speak), checked at registration
        # so a bad name fails the request before any stage works on it.
        self.speakers = (
            (self.processor.speakers if self.processor else None) or engine.speakers or _format_voices(stage)
        )
        # Its hidden rows go to the stages that take its output (packed: one tensor per layer
        # and step), and to a client only for the requests that asked (Submit.hidden_states).
        self.emits_hidden = stage.hidden_states is not None
        self.requests: dict[str, StageRequestState] = {}
        self.orphans = OrphanChunks()
        self.ended = EndedRequests()
        self.running = True
        self.timeline = StepTimeline(stage.id)
        self.profiler = StepProfiler(stage.id)  # OMNI_MP_TORCH_PROFILE windows (diagnosis only)
        self.counters = StageCounters()  # reported with the heartbeats
        self._in_engine = 0  # requests of `requests` handed to the engine (started)
        self._alive_at = time.monotonic()
        self._rows_in = 0  # step-embedding rows taken since the last step (for the timeline)
        self._handle_s = 0.0  # engine thread: handling input messages since the last step (timeline)
        self._stop = threading.Event()
        self.inbox = Inbox(self._stop)
        # Entry stages prepare requests (media, prompt format, vLLM input processing) off this thread.
        self.preparer = None if stage.inputs else Preparer(stage, engine, self.inbox.put, self._stop)
        # Same host (ipc): tensors above the threshold go through a shared-memory pool per link.
        shm = link_pools(cfg, stage.id) if cfg.endpoints.transport == "ipc" else None
        self.input = InputPump(input_link, self.inbox, self._stop, stage.id, on_request=self._arrived)
        self.output = OutputPump(ctx, events, self.limits, shm, self._stop, stage.id, self._sent, replica)
        timeouts = cfg.timeouts
        self.heart = Heartbeater(
            heartbeat_link,
            stage.id,
            timeouts.heartbeat_interval_s,
            timeouts.heartbeat_timeout_s / 2,
            lambda: self._alive_at,
            self._stop,
            self.counters.snapshot,
            replica,
        )

    # ---- outgoing -------------------------------------------------------------------------
    def _alive(self) -> None:
        self._alive_at = time.monotonic()

    def _sent(self, step: int, seconds: float, cpu_seconds: float, per_link: dict[int, int]) -> None:
        """Output thread: a step's messages went out, these bytes to each downstream stage."""
        self.timeline.sent(step, seconds, sum(per_link.values()), cpu_seconds)
        self.counters.sent(per_link)

    def _queue(self, item: Outgoing | Connect | None) -> None:
        self.output.put(item, self._alive)

    def _emit(self, msg: Message) -> None:
        self._queue(Outgoing(msg, to_events=True, downstream=False))

    def _error(self, request_id: str, code: str, message: str) -> None:
        log.warning("request %s: %s: %s", request_id, code, message)
        self._emit(ErrorEvent(request_id=request_id, stage_id=self.stage.id, code=code, message=message))

    # ---- incoming -------------------------------------------------------------------------
    def _arrived(self, msg: StageRequest) -> None:
        """Input thread: a registration, stamped, for the engine thread; an entry stage's
        preparation is queued here too, so it runs beside the engine's step in flight instead of
        starting after it (the engine thread registers between steps: waiting for that cost a
        request arriving mid-step the rest of the step, and then a whole step more for its
        Prepared to be picked up)."""
        if self.preparer is None:
            self.inbox.put(Arrival(msg, time.time()))
            return
        token = object()
        self.inbox.put(Arrival(msg, time.time(), token))  # first: registered before its Prepared can come
        if not self.preparer.submit(PrepareJob(msg, msg.sampling_params or self.stage.sampling, token)):
            why = f"stage {self.stage.id}: too many requests wait for their preparation"
            self.inbox.put(Prepared(msg.request_id, token, code="overloaded", error=why))

    def _on_request(self, arrival: Arrival) -> None:
        msg = arrival.msg
        rid = msg.request_id
        if rid in self.requests:
            self._error(rid, "duplicate_request", f"request id {rid!r} is already active in stage {self.stage.id}")
            return
        state = StageRequestState(
            request_id=rid,
            sampling=msg.sampling_params or self.stage.sampling,
            deadline=None if msg.deadline_s is None else time.monotonic() + msg.deadline_s,
            inputs=list(self.stage.inputs),
            ctx=RequestContext(speaker=msg.speaker, params=msg.params),
            hidden_to_client=msg.hidden_states,
            targets=_targets(self.downstream_ids, msg.downstream_replicas),
            t_registered=arrival.t_received,
            prepare_token=arrival.prepare_token,
        )
        self.requests[rid] = state
        try:  # checked at registration: a bad request fails before any stage works on it
            self.engine.check_params(msg.params)
        except EngineInputError as err:
            self._fail(rid, "invalid_input", f"stage {self.stage.id}: {err}")
            return
        if msg.speaker is not None and self.speakers is not None and msg.speaker not in self.speakers:
            self._fail(
                rid,
                "invalid_input",
                f"unknown speaker {msg.speaker!r}; stage {self.stage.id} has {sorted(self.speakers)}",
            )
            return
        if self.preparer is not None:
            return  # its preparation is under way (_arrived); _on_prepared starts it
        for chunk in self.orphans.take(rid):
            self._on_chunk(chunk)

    def _on_chunk(self, chunk: StageOutputChunk) -> None:
        rid = chunk.request_id
        state = self.requests.get(rid)
        if state is None:
            if rid in self.ended:
                return  # a late chunk of a request that ended here: drop it, and its buffers with it
            reason = self.orphans.add(chunk)
            if reason is not None:  # it cannot wait for its registration: end it rather than lose it
                self.ended.add(rid)
                self._error(rid, "overloaded", f"stage {self.stage.id}: {reason}")
            return
        if chunk.stage_id not in state.inputs:
            self._fail(rid, "invalid_input", f"stage {chunk.stage_id} is not an input of stage {self.stage.id}")
            return
        try:
            state.add_upstream(chunk)
            assert self.processor is not None  # validated in config: stages with inputs have one
            if not state.started:
                if self.stage.wait_for_upstream and not all(
                    rid_up in state.upstream and state.upstream[rid_up].finished for rid_up in state.inputs
                ):
                    return
                stage_input = self.processor.prompt(state.upstream, state.ctx)
                if stage_input is None:
                    return
                if isinstance(stage_input, Silent):
                    self._end_silent(state)
                    return
                if self.processor.step_embeds_enabled:
                    stage_input = msgspec.structs.replace(stage_input, step_embeds=True)
                self._start(state, self.engine.prepare(rid, state.sampling, stage_input, state.ctx.speaker))
            self._extend(state)
        except (ProcessorError, EngineInputError) as err:
            self._fail(rid, "invalid_input", f"from stage {chunk.stage_id}: {err}")

    def _end_silent(self, state: StageRequestState) -> None:
        """End a request that has nothing for this stage: one empty finished chunk (downstream,
        and to the coordinator when final), then its StageDone, as if the engine had finished it."""
        rid, now = state.request_id, time.time()
        chunk = StageOutputChunk(
            request_id=rid,
            stage_id=self.stage.id,
            finished=True,
            finish_reason=SILENT_REASON,
            text="" if self.stage.final_output else None,
        )
        self._end(rid, in_engine=False)
        batch = StageOutputBatch.pack([chunk])
        self._queue(Outgoing(batch, to_events=self.stage.final_output, downstream=True, targets=state.targets))
        self._emit(self._done(state, SILENT_REASON, now))

    def _extend(self, state: StageRequestState) -> None:
        """Hand a started request what its upstream streamed in since the last call."""
        p = self.processor
        assert p is not None
        rows, ids, closed = None, [], False
        if p.step_embeds_enabled:
            rows, closed = p.step_embeds(state.upstream, state.rows_extended)
            rows = rows if rows is not None and rows.shape[0] else None
        elif p.streams_inputs:
            ids, closed = p.more_inputs(state.upstream, state.prompt_len + state.inputs_extended)
        if rows is None and not ids and not closed:
            return
        self.engine.extend(state.request_id, Extension(step_rows=rows, input_ids=ids, closed=closed))
        n = 0 if rows is None else rows.shape[0]
        state.rows_extended += n
        state.inputs_extended += len(ids)
        self._rows_in += n

    def _on_prepared(self, result: Prepared) -> None:
        state = self.requests.get(result.request_id)
        if state is None or state.prepare_token is not result.token:
            return  # ended (aborted, expired, refused at registration) while it was prepared
        if result.request is None:
            self._fail(result.request_id, result.code, result.error)
            return
        state.first_chunk_info = result.first_chunk_info
        state.prepare_times = result.times
        try:
            self._start(state, result.request)
        except EngineInputError as err:
            self._fail(result.request_id, "invalid_input", str(err))

    def _start(self, state: StageRequestState, prepared: PreparedRequest) -> None:
        """Hand a prepared request to the engine (raises EngineInputError on input it rejects)."""
        prompt_ids = self.engine.add(prepared)
        state.started = True
        self._in_engine += 1
        state.t_started = time.time()
        state.prompt_len = prompt_ids.length
        # The prompt as the model saw it (media placeholders expanded); None for embeddings.
        state.prompt_token_ids = prompt_ids.token_ids

    def _end(self, request_id: str, *, in_engine: bool = True) -> StageRequestState | None:
        """Forget a request here: the one way a request ends in this stage (finished, failed or
        aborted). Its late upstream chunks are dropped from now on; `in_engine`: the engine
        still holds it (not after it finished there) and aborts it."""
        state = self.requests.pop(request_id, None)
        if state is not None and state.started:
            self._in_engine -= 1
        self.orphans.take(request_id)
        self.ended.add(request_id)
        if in_engine and state is not None and state.started:
            self.engine.abort([request_id])
        return state

    def _on_abort(self, msg: Abort) -> None:
        self._end(msg.request_id)

    def _fail(self, request_id: str, code: str, message: str) -> None:
        """End a request here with an error; the coordinator aborts it in every other stage."""
        self._end(request_id)
        self._error(request_id, code, message)

    def _handle(self, msg: Message | InputError | Prepared) -> None:
        if isinstance(msg, InputError):
            # Dropped; if it names a request, that request (only) ends with the reason.
            rid = msg.error.request_id
            if rid is not None and rid in self.requests:
                self._fail(rid, "invalid_payload", str(msg.error))
        elif isinstance(msg, StageOutputBatch):
            try:
                chunks = msg.unpacked()
            except PayloadError as err:  # the requests it names end with the reason
                for chunk in msg.chunks:
                    if chunk.request_id in self.requests:
                        self._fail(chunk.request_id, "invalid_payload", str(err))
                return
            for chunk in chunks:
                self._on_chunk(chunk)
        elif isinstance(msg, Prepared):
            self._on_prepared(msg)
        elif isinstance(msg, Arrival):
            self._on_request(msg)
        elif isinstance(msg, Abort):
            self._on_abort(msg)
        elif isinstance(msg, Connect):
            self._queue(msg)  # the output thread owns the downstream links
        elif isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            self.running = False
        else:
            log.warning("stage %d ignores unexpected %s", self.stage.id, type(msg).__name__)

    def _drain_input(self, timeout_s: float) -> None:
        for msg in self.inbox.take(timeout_s):
            t0 = time.perf_counter()
            with self.profiler.scope("omni: handle input"):
                self._handle(msg)
            self._handle_s += time.perf_counter() - t0
            if not self.running:
                return

    # ---- engine -----------------------------------------------------------------------------
    def _step(self, wait_s: float) -> bool:
        """One engine step; queues every request's new tokens (and hidden rows, audio). Returns
        whether the step computed anything."""
        t0 = time.perf_counter()
        with self.profiler.scope("omni: engine step"):
            outputs, executed = self.engine.step()
        t1, cpu1 = time.perf_counter(), time.thread_time()
        with self.profiler.scope("omni: step outputs"):
            self._step_outputs(outputs, executed, wait_s, t0, t1, cpu1)
        return executed

    def _step_outputs(
        self, outputs: list[Any], executed: bool, wait_s: float, t0: float, t1: float, cpu1: float
    ) -> None:
        """Queue one step's outputs and record the step in the timeline."""
        now = time.time()
        self.counters.stepped(t1 - t0)
        for rid, reason in self.engine.take_failed().items():
            if rid in self.requests:
                self._fail(rid, "internal_error", f"stage {self.stage.id}: {reason}")
        chunks: list[StageOutputChunk] = []
        # A final stage with hidden rows sends the coordinator a copy of the step with the rows
        # of the requests that asked for them only.
        split = self.emits_hidden and self.stage.final_output
        rows_for: set[str] = set()
        done: list[StageDone] = []
        rows = 0
        targets_of: dict[str, tuple[tuple[int, int], ...]] = {}
        for out in outputs:
            state = self.requests.get(out.request_id)
            if state is None:  # ended while the step ran
                continue
            targets_of[out.request_id] = state.targets
            rows += 0 if out.hidden is None or out.hidden.last is None else out.hidden.last.shape[0]
            if (out.new_token_ids or out.info) and state.t_first_token is None:
                state.t_first_token = now
            state.cached_tokens = out.cached_tokens or state.cached_tokens
            state.output_token_ids.extend(out.new_token_ids)
            first = not state.sent_first
            state.sent_first = True
            info = out.info
            if first and state.first_chunk_info:  # the entry stage's values for downstream
                info = {**state.first_chunk_info, **(info or {})}
            final_text = out.finished and self.stage.final_output
            chunks.append(
                StageOutputChunk(
                    request_id=out.request_id,
                    stage_id=self.stage.id,
                    token_ids=out.new_token_ids,
                    prompt_token_ids=state.prompt_token_ids if first else None,
                    hidden=out.hidden,
                    additional_information=info,  # e.g. a diffusion stage's audio chunk
                    finished=out.finished,
                    finish_reason=out.finish_reason,
                    text=self.engine.decode(state.output_token_ids) if final_text else None,
                )
            )
            if state.hidden_to_client:
                rows_for.add(out.request_id)
            if out.finished:
                self._end(out.request_id, in_engine=False)
                done.append(self._done(state, out.finish_reason, now))
        step = self.timeline.steps
        self.timeline.steps += 1
        if chunks:
            to_events = self.stage.final_output and not split
            for targets, group in _by_targets(chunks, targets_of).items():  # one group per bound replica set
                self._queue(
                    Outgoing(
                        StageOutputBatch.pack(group), to_events=to_events, downstream=True, step=step, targets=targets
                    )
                )
            if split:
                self._queue(
                    Outgoing(StageOutputBatch.pack(chunks, rows_for), to_events=True, downstream=False, step=step)
                )
        for msg in done:  # after the chunks: the coordinator reads them in this order
            self._emit(msg)
        if executed or chunks:
            begun, ended = self.engine.step_progress()
            self.timeline.add(
                StepRecord(
                    step=step,
                    t=now - (t1 - t0),
                    step_ms=(t1 - t0) * 1000,
                    wait_ms=wait_s * 1000,
                    reqs=len(chunks),
                    rows=rows + self._rows_in,
                    build_ms=(time.perf_counter() - t1) * 1000,
                    build_cpu_ms=(time.thread_time() - cpu1) * 1000,
                    recv_ms=self.input.take_recv_s() * 1000,
                    handle_ms=self._handle_s * 1000,
                    steps_begun=begun,
                    steps_ended=ended,
                )
            )
        self._rows_in, self._handle_s = 0, 0.0

    def _done(self, state: StageRequestState, finish_reason: str | None, now: float) -> StageDone:
        taken, built, prepared = state.prepare_times or (None, None, None)
        return StageDone(
            request_id=state.request_id,
            stage_id=self.stage.id,
            num_prompt_tokens=state.prompt_len + state.inputs_extended,  # with inputs streamed in after the start
            num_output_tokens=len(state.output_token_ids),
            num_cached_tokens=state.cached_tokens,
            t_registered=state.t_registered,
            t_started=state.t_started or now,
            t_first_token=state.t_first_token,
            t_finished=now,
            finish_reason=finish_reason,
            replica=self.replica,
            t_prepare_taken=taken,
            t_input_built=built,
            t_prepared=prepared,
        )

    def _expire(self, now: float) -> None:
        for rid in [r for r, s in self.requests.items() if s.expired(now)]:
            self._fail(rid, "deadline_exceeded", f"deadline passed in stage {self.stage.id}")
        self.orphans.expire()

    def run(self) -> None:
        """The engine thread; returns on Shutdown or when an I/O thread fails."""
        threads = [self.input, self.output, self.heart, *([self.preparer] if self.preparer else [])]
        for thread in threads:
            thread.start()
        try:
            idle_step = False  # the last step computed nothing (every request waits on upstream)
            while self.running and not self._stop.is_set():
                self._alive()
                self.profiler.at(self.timeline.steps)
                busy = self.engine.can_step() and not idle_step
                t_wait = time.perf_counter()
                self._drain_input(0 if busy else IDLE_WAIT_S)
                waited = time.perf_counter() - t_wait
                if not self.running:
                    break
                self._expire(time.monotonic())
                idle_step = not self._step(waited) if self.engine.can_step() else False
                self.counters.requests(self._in_engine, len(self.requests) - self._in_engine)
        finally:
            self._stop.set()
            if self.output.is_alive():
                self.output.put(None, self._alive)  # flush what is queued, then stop
                self.output.join(timeout=10)
            for thread in threads[2:]:
                thread.join(timeout=2)
            self.input.join(timeout=2)
            self.output.close_links()
            self.timeline.write()
            self.profiler.close(self.timeline.steps)
        for thread in (self.input, self.output, self.preparer):
            if thread is not None and thread.error is not None:
                raise RuntimeError(f"stage {self.stage.id}: {thread.name} failed") from thread.error


def _by_targets(
    chunks: list[StageOutputChunk], targets_of: dict[str, tuple[tuple[int, int], ...]]
) -> dict[tuple[tuple[int, int], ...], list[StageOutputChunk]]:
    """A step's chunks grouped by the downstream replicas their requests are bound to: one
    message per group (with one replica per stage, the whole step in one message, as before)."""
    groups: dict[tuple[tuple[int, int], ...], list[StageOutputChunk]] = {}
    for chunk in chunks:
        groups.setdefault(targets_of[chunk.request_id], []).append(chunk)
    return groups


def _targets(downstream: list[int], bound: list[BoundReplica]) -> tuple[tuple[int, int], ...]:
    """The (stage, replica) links a request's outputs go to: its bound replica of each
    downstream stage (replica 0 where none is named)."""
    replica = {b.stage_id: b.replica for b in bound}
    return tuple((d, replica.get(d, 0)) for d in downstream)


MIN_POOL_BYTES = 16 * 2**20


def link_pools(cfg: PipelineConfig, stage_id: int) -> dict[int, ShmPoolConfig]:
    """Each downstream stage's links' shared-memory pool. A stage with R replicas gets R links
    from each upstream replica, each with 1/R of `endpoints.shm` (at least MIN_POOL_BYTES): a
    pool is prefaulted, so R full pools would pin R times the memory (at 64 x 64 replicas, 4160
    links of 256 MiB: 1 TiB; benchmarks/replica_scaling.py), while a request's rows go to one
    replica only."""
    base = cfg.endpoints.shm
    out = {}
    for d in cfg.downstream(stage_id):
        n = cfg.stage(d).replicas
        capacity = max(base.capacity_bytes // n, min(base.capacity_bytes, MIN_POOL_BYTES))
        slots = min(base.num_slots, max(base.num_slots // n, 16))
        out[d] = msgspec.structs.replace(base, capacity_bytes=capacity, num_slots=slots)
    return out


def _format_voices(stage: StageConfig) -> frozenset[str] | None:
    """The voices of an entry stage whose prompt format builds its input (a TTS talker's presets)."""
    from omni_mp.models.registry import prompt_format

    if stage.prompt_format is None:
        return None
    fmt = prompt_format(stage.prompt_format)
    voices = getattr(fmt, "voices", None)
    return voices(resolve_model(stage.model)) if voices is not None else None

"""The stage process main loop: receive, add to the engine, step, stream each step's outputs.

One thread owns the engine and every socket. Each iteration drains the input socket
(requests from the coordinator, chunks from upstream stages, aborts), runs one engine step
over the whole batch when there is work, and forwards the new tokens of every request at
once: downstream stages get every chunk, the coordinator gets the chunks of final stages
and a `StageDone` per finished request. Bad input for one request becomes an `ErrorEvent`
for that request; the loop keeps serving the others.
"""

from __future__ import annotations

import logging
import time

import torch
import zmq

from omni_mp.config import PipelineConfig, StageConfig
from omni_mp.control.endpoints import CONTROL_HWM
from omni_mp.engines.ar import AREngine, EngineInputError
from omni_mp.engines.vllm_hooks import CapturedRows, StepEmbeds
from omni_mp.processors import PROCESSORS, ProcessorError, StageInput
from omni_mp.stage.requests import OrphanChunks, StageRequestState
from omni_mp.wire.payload import (
    Abort,
    AdditionalInformation,
    Connect,
    Connected,
    ErrorEvent,
    Heartbeat,
    Limits,
    Message,
    PayloadError,
    Shutdown,
    StageDone,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
)
from omni_mp.wire.shm_pool import ShmPoolConfig
from omni_mp.wire.transport import MessageReceiver, MessageSender

log = logging.getLogger("omni_mp.stage")

IDLE_POLL_MS = 50  # how long an idle stage blocks waiting for input
# Sends to the coordinator and downstream stages wait at most this long for queue space (a
# consumer that stays full this long is hung; the coordinator then restarts or fails it).
SEND_TIMEOUT_S = 30.0


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)  # one forward per step: usually one part


class StageLoop:
    def __init__(
        self,
        cfg: PipelineConfig,
        stage: StageConfig,
        engine: AREngine,
        ctx: zmq.Context,
        input_link: MessageReceiver,
        events: MessageSender,
    ) -> None:
        self.cfg = cfg
        self.stage = stage
        self.engine = engine
        self.ctx = ctx
        self.limits: Limits = cfg.limits
        self.input = input_link
        self.events = events
        self.downstream: dict[int, MessageSender] = {}
        # Same host (ipc): tensors above the threshold go through a shared-memory pool per link.
        self.shm: ShmPoolConfig | None = cfg.endpoints.shm if cfg.endpoints.transport == "ipc" else None
        self.processor = PROCESSORS[stage.processor] if stage.processor else None
        # None: this stage emits no hidden states; else the intermediate layers it adds.
        self.hidden_layers: list[int] | None = None if stage.hidden_states is None else list(stage.hidden_states.layers)
        # The chunk tensors that travel packed: one tensor per key and step, not per request.
        self.hidden_keys: list[str] = []
        if self.hidden_layers is not None:
            self.hidden_keys = ["hidden_states", *(f"hidden_states.layer{k}" for k in self.hidden_layers)]
        self.requests: dict[str, StageRequestState] = {}
        self.orphans = OrphanChunks()
        self.running = True
        self._hb_seq = 0
        self._next_hb = 0.0

    # ---- outgoing -------------------------------------------------------------------------
    def _emit(self, msg: Message) -> None:
        self.events.send(msg, timeout=SEND_TIMEOUT_S)

    def _error(self, request_id: str, code: str, message: str) -> None:
        log.warning("request %s: %s: %s", request_id, code, message)
        self._emit(ErrorEvent(request_id=request_id, stage_id=self.stage.id, code=code, message=message))

    def _heartbeat(self, now: float) -> None:
        if now >= self._next_hb:
            self._hb_seq += 1
            self._emit(Heartbeat(stage_id=self.stage.id, seq=self._hb_seq, time=now))
            self._next_hb = now + self.cfg.timeouts.heartbeat_interval_s

    # ---- incoming -------------------------------------------------------------------------
    def _on_connect(self, msg: Connect) -> None:
        for target in msg.downstream:
            old = self.downstream.pop(target.stage_id, None)
            if old is not None:
                old.close()
            self.downstream[target.stage_id] = MessageSender(
                self.ctx, target.endpoint, self.limits, shm=self.shm, hwm=CONTROL_HWM
            )
        # The coordinator admits requests only once every link is open (a pool is prefaulted
        # when it is created: doing that under the first request would delay it).
        self._emit(Connected(stage_id=self.stage.id, downstream=list(msg.downstream)))

    def _on_request(self, msg: StageRequest) -> None:
        rid = msg.request_id
        if rid in self.requests:
            self._error(rid, "duplicate_request", f"request id {rid!r} is already active in stage {self.stage.id}")
            return
        state = StageRequestState(
            request_id=rid,
            sampling=msg.sampling_params or self.stage.sampling,
            deadline=msg.deadline,
            inputs=list(self.stage.inputs),
        )
        self.requests[rid] = state
        if not self.stage.inputs:
            try:
                if msg.prompt_embeds is not None:
                    # A copy: the received tensor is a view of the message buffer.
                    stage_input = StageInput(prompt_embeds=msg.prompt_embeds.data.clone())
                elif msg.prompt_token_ids is not None:
                    stage_input = StageInput(prompt_token_ids=list(msg.prompt_token_ids))
                elif msg.prompt is not None:
                    stage_input = StageInput(prompt_token_ids=self.engine.tokenize(msg.prompt))
                else:
                    raise EngineInputError("an entry stage needs a prompt, prompt_token_ids or prompt_embeds")
                self._start(state, stage_input)
            except EngineInputError as err:
                self._fail(rid, "invalid_input", str(err))
            return
        for chunk in self.orphans.take(rid):
            self._on_chunk(chunk)

    def _on_chunk(self, chunk: StageOutputChunk) -> None:
        state = self.requests.get(chunk.request_id)
        if state is None:
            if not self.orphans.add(chunk):
                log.warning("dropping chunk of unknown request %s: orphan buffer full", chunk.request_id)
            return
        if chunk.stage_id not in state.inputs:
            self._fail(
                chunk.request_id, "invalid_input", f"stage {chunk.stage_id} is not an input of stage {self.stage.id}"
            )
            return
        try:
            state.add_upstream(chunk)
            assert self.processor is not None  # validated in config: stages with inputs have one
            if not state.started:
                stage_input = self.processor.prompt(state.upstream)
                if stage_input is None:
                    return
                self._start(state, stage_input)
            if state.started and self.processor.step_embeds_enabled:
                self._push_step_embeds(state)
        except (ProcessorError, EngineInputError) as err:
            self._fail(state.request_id, "invalid_input", f"from stage {chunk.stage_id}: {err}")

    def _push_step_embeds(self, state: StageRequestState) -> None:
        assert self.processor is not None
        rows, complete = self.processor.step_embeds(state.upstream, state.step_rows_pushed)
        if rows is not None and rows.shape[0]:
            self.engine.add_step_embeds(state.request_id, rows)
            state.step_rows_pushed += rows.shape[0]
        if complete:
            self.engine.close_step_embeds(state.request_id)

    def _start(self, state: StageRequestState, stage_input: StageInput) -> None:
        """Hand the request to the engine (raises EngineInputError on input vLLM rejects)."""
        step_embeds = None
        if self.processor is not None and self.processor.step_embeds_enabled:
            step_embeds = StepEmbeds(fill=torch.zeros(self.engine.hidden_size))
        prompt_len = self.engine.add_request(
            state.request_id,
            state.sampling,
            prompt_token_ids=stage_input.prompt_token_ids,
            prompt_embeds=stage_input.prompt_embeds,
            step_embeds=step_embeds,
        )
        state.started = True
        state.t_started = time.time()
        state.prompt_len = prompt_len
        state.prompt_token_ids = stage_input.prompt_token_ids

    def _on_abort(self, msg: Abort) -> None:
        state = self.requests.pop(msg.request_id, None)
        self.orphans.take(msg.request_id)
        if state is not None and state.started:
            self.engine.abort([msg.request_id])

    def _fail(self, request_id: str, code: str, message: str) -> None:
        """End a request here with an error; the coordinator aborts it in every other stage."""
        state = self.requests.pop(request_id, None)
        if state is not None and state.started:
            self.engine.abort([request_id])
        self._error(request_id, code, message)

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, StageOutputBatch):
            try:
                chunks = msg.unpacked()
            except PayloadError as err:  # the requests it names end with the reason
                for chunk in msg.chunks:
                    if chunk.request_id in self.requests:
                        self._fail(chunk.request_id, "invalid_payload", str(err))
                return
            for chunk in chunks:
                self._on_chunk(chunk)
        elif isinstance(msg, StageRequest):
            self._on_request(msg)
        elif isinstance(msg, Abort):
            self._on_abort(msg)
        elif isinstance(msg, Connect):
            self._on_connect(msg)
        elif isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            self.running = False
        else:
            log.warning("stage %d ignores unexpected %s", self.stage.id, type(msg).__name__)

    def _drain_input(self, timeout_ms: int) -> None:
        if not self.input.socket.poll(timeout_ms):
            return
        while True:
            try:
                msg = self.input.recv(timeout=0)
            except TimeoutError:
                return
            except PayloadError as err:
                # Dropped; if it names a request, that request (only) ends with the reason.
                log.error("stage %d dropped an invalid message: %s", self.stage.id, err)
                if err.request_id is not None and err.request_id in self.requests:
                    self._fail(err.request_id, "invalid_payload", str(err))
                continue
            self._handle(msg)
            if not self.running:
                return

    # ---- engine -----------------------------------------------------------------------------
    def _hidden_info(self, state: StageRequestState, captured: list[CapturedRows]) -> AdditionalInformation | None:
        """The step's new hidden-state rows of a request, in position order. Rows a request
        recomputes after preemption were sent already and are skipped."""
        last, layers = [], {k: [] for k in self.hidden_layers}
        for rows in captured:
            skip = max(0, state.hidden_next - rows.start)
            if skip >= rows.last.shape[0]:
                continue
            if rows.start + skip != state.hidden_next:
                raise RuntimeError(f"hidden states of {state.request_id}: gap at position {state.hidden_next}")
            last.append(rows.last[skip:])
            for k in self.hidden_layers:
                layers[k].append(rows.layers[k][skip:])
            state.hidden_next = rows.start + rows.last.shape[0]
        if not last:
            return None
        start = state.hidden_next - sum(t.shape[0] for t in last)
        info: AdditionalInformation = {"hidden_start": start, "hidden_states": _cat(last)}
        for k, parts in layers.items():
            info[f"hidden_states.layer{k}"] = _cat(parts)
        return info

    def _step(self) -> bool:
        """One engine step; forwards every request's new tokens (and hidden states). Returns
        whether the step computed anything."""
        outputs, executed = self.engine.step()
        now = time.time()
        by_request = {out.request_id: out for out in outputs}
        with_hidden = [rid for rid in self.engine.io.captured if rid in self.requests]
        chunks: list[StageOutputChunk] = []
        done: list[StageDone] = []
        for rid in dict.fromkeys([*by_request, *with_hidden]):
            state = self.requests.get(rid)
            if state is None:  # aborted while the step ran
                self.engine.io.forget(rid)
                continue
            out = by_request.get(rid)
            info = self._hidden_info(state, self.engine.take_hidden(rid)) if self.hidden_layers is not None else None
            first = not state.sent_first
            state.sent_first = True
            new_ids = out.new_token_ids if out is not None else []
            if new_ids and state.t_first_token is None:
                state.t_first_token = now
            state.output_token_ids.extend(new_ids)
            finished = out is not None and out.finished
            chunk = StageOutputChunk(
                request_id=rid,
                stage_id=self.stage.id,
                token_ids=new_ids,
                prompt_token_ids=state.prompt_token_ids if first else None,
                additional_information=info,
                finished=finished,
                finish_reason=out.finish_reason if out is not None else None,
                text=self.engine.decode(state.output_token_ids) if finished and self.stage.final_output else None,
            )
            chunks.append(chunk)
            if finished:
                del self.requests[rid]
                done.append(
                    StageDone(
                        request_id=rid,
                        stage_id=self.stage.id,
                        num_prompt_tokens=state.prompt_len,
                        num_output_tokens=len(state.output_token_ids),
                        t_registered=state.t_registered,
                        t_started=state.t_started or now,
                        t_first_token=state.t_first_token,
                        t_finished=now,
                        finish_reason=out.finish_reason if out is not None else None,
                    )
                )
        if chunks:
            batch = StageOutputBatch.pack(chunks, self.hidden_keys) if self.hidden_keys else StageOutputBatch(chunks)
            for link in self.downstream.values():
                link.send(batch, timeout=SEND_TIMEOUT_S)
            if self.stage.final_output:
                self._emit(batch)
        for msg in done:  # after the chunks: the coordinator reads them in this order
            self._emit(msg)
        return executed

    def _expire(self, now: float) -> None:
        for rid in [r for r, s in self.requests.items() if s.expired(now)]:
            self._fail(rid, "deadline_exceeded", f"deadline passed in stage {self.stage.id}")
        self.orphans.expire()

    def run(self) -> None:
        idle_step = False  # the last step computed nothing (every request waits on upstream)
        while self.running:
            busy = self.engine.can_step() and not idle_step
            self._drain_input(0 if busy else IDLE_POLL_MS)
            if not self.running:
                break
            now = time.time()
            self._heartbeat(now)
            self._expire(now)
            idle_step = not self._step() if self.engine.can_step() else False

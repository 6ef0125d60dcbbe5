"""One `/v1/realtime` session: its settings, input buffer and VAD, its conversation, and at most
one response in flight. Client events come in through `handle`; every refusal is an `error`
event for this session only (the session goes on).

Barge-in: with server VAD, speech starting while a response runs cancels it (turn_detection's
`interrupt_response`, default from `http.realtime.barge_in`): the response's task is cancelled
before `speech_started` is sent, so no audio delta of it follows; closing its stream aborts the
request in every stage; the answer stays in the history as far as it was produced (and as far
as it was played, once the client sends `conversation.item.truncate`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import numpy as np

from omni_mp.config.schema import RealtimeConfig
from omni_mp.http.errors import ApiError, from_validation
from omni_mp.http.realtime.audio_buffer import InputBuffer, samples_of, to_model_rate
from omni_mp.http.realtime.events import (
    BETA_NAMES,
    CLIENT_EVENTS,
    Append,
    Envelope,
    ErrorBody,
    Item,
    ItemCreate,
    ItemRef,
    RealtimeError,
    ResponseCreate,
    ServerEvent,
    SessionUpdate,
    Truncate,
)
from omni_mp.http.realtime.history import History, HistoryItem, new_id, played_prefix
from omni_mp.http.realtime.jobs import response_job
from omni_mp.http.realtime.response import ResponseRun, api_error_body
from omni_mp.http.realtime.settings import Settings, apply_update, modalities_of, session_json
from omni_mp.http.realtime.transcripts import InputTranscripts
from omni_mp.http.realtime.vad import Detector
from omni_mp.http.realtime.wire_audio import WireFormat
from omni_mp.http.transcriptions import transcriber

log = logging.getLogger("omni_mp.http.realtime")
MIN_COMMIT_MS = 100  # OpenAI's: a commit of less audio is refused (input_audio_buffer_commit_empty)
_BETA_ONLY_GA = {"conversation.item.done"}  # GA events beta has no counterpart of


class RealtimeSession:
    def __init__(
        self, server: Any, send_text: Callable[[str], Awaitable[None]], beta: bool, cfg: RealtimeConfig
    ) -> None:
        self.srv, self.beta, self.cfg = server, beta, cfg
        self.id = f"sess_{uuid.uuid4().hex[:24]}"
        self._send_text = send_text
        self._lock = asyncio.Lock()
        view = server.view
        can_speak = view.audio_stage is not None
        default_voice = server.voices.resolve("alloy") if can_speak else None
        self.settings = Settings(voice=default_voice, audio_out=can_speak)
        self.settings.turns.interrupt_response = cfg.barge_in
        self.history = History(cfg.max_history_items, view.media_limits.max_audios)
        self.buffer = InputBuffer(cfg.max_turn_audio_s)
        self.transcripts = InputTranscripts(server, self.send)
        self.vad: Detector | None = None
        self.response: ResponseRun | None = None
        self.task: asyncio.Task[None] | None = None
        self.last_barge_in_s: float | None = None  # speech_started -> the request aborted (its stream closed)

    # ---- sending ----------------------------------------------------------------------------

    async def send(self, type: str, **fields: Any) -> None:
        if self.beta:
            if type in _BETA_ONLY_GA:
                return
            type = BETA_NAMES.get(type, type)
        ev = ServerEvent(type=type, event_id=f"event_{uuid.uuid4().hex[:20]}", **fields)
        text = msgspec.json.encode(ev).decode()
        async with self._lock:
            await self._send_text(text)

    async def error(self, body: ErrorBody) -> None:
        await self.send("error", error=body)

    async def started(self) -> None:
        self._reset_vad()
        await self.send("session.created", session=self._session_json())

    def _session_json(self) -> dict[str, Any]:
        return session_json(self.settings, self.id, self.srv.settings.model, self.beta)

    def _reset_vad(self) -> None:
        vad = self.settings.turns.vad
        if vad is None:
            self.vad = None
        elif self.vad is None or self.vad.settings != vad:
            self.vad = Detector(vad)

    # ---- client events ----------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> None:
        """One client event; a refusal is an `error` event naming what was wrong."""
        event_id = None
        try:
            try:
                env = msgspec.json.decode(raw, type=Envelope)
            except msgspec.MsgspecError as err:
                raise RealtimeError(f"not a JSON client event with a `type`: {err}", "invalid_json") from None
            event_id = env.event_id
            schema = CLIENT_EVENTS.get(env.type)
            if schema is None:
                raise RealtimeError(f"unknown client event type {env.type!r}; supported are {sorted(CLIENT_EVENTS)}",
                                    "unknown_event", "type")  # fmt: skip
            try:
                ev = msgspec.json.decode(raw, type=schema)
            except msgspec.ValidationError as err:
                api = from_validation(err)  # (the param: the field's JSON path)
                raise RealtimeError(f"{env.type}: {api.body.error.message}", api.code, api.body.error.param) from None
            await self._dispatch(env.type, ev)
        except RealtimeError as err:
            err.body.event_id = event_id
            await self.error(err.body)

    async def _dispatch(self, kind: str, ev: Any) -> None:
        if kind == "session.update":
            await self._update(ev)
        elif kind == "input_audio_buffer.append":
            await self._append(ev)
        elif kind == "input_audio_buffer.commit":
            self._transcribe(await self._commit(None))
        elif kind == "input_audio_buffer.clear":
            self.buffer.clear()
            await self.send("input_audio_buffer.cleared")
        elif kind == "conversation.item.create":
            await self._item_create(ev)
        elif kind == "conversation.item.truncate":
            await self._truncate(ev)
        elif kind == "response.create":
            await self._response_create(ev)
        elif kind == "response.cancel":
            if self.response is None:
                raise RealtimeError("no response is in progress", "response_cancel_not_active")
            await self.cancel_response()
        elif kind in ("conversation.item.delete", "conversation.item.retrieve"):
            await self._item_ref(kind, ev)
        elif kind == "output_audio_buffer.clear":
            await self.send("output_audio_buffer.cleared")

    async def _update(self, ev: SessionUpdate) -> None:
        s, new = self.srv, Settings(**vars(self.settings))
        apply_update(new, ev.session, s.voices, s.view.audio_stage is not None, self.cfg.barge_in)
        if new.transcription is not None:
            try:
                transcriber(s.view)
            except ApiError as err:
                raise RealtimeError(f"input audio transcription: {err.body.error.message}", "unsupported_value",
                                    "session.audio.input.transcription") from None  # fmt: skip
        if new.in_format != self.settings.in_format:  # (audio buffered in the old format is dropped)
            self.buffer = InputBuffer(self.cfg.max_turn_audio_s, new.in_format.rate)
        self.settings = new
        self._reset_vad()
        await self.send("session.updated", session=self._session_json())

    async def _append(self, ev: Append) -> None:
        pcm = samples_of(ev.audio, self.settings.in_format, self.cfg.max_append_bytes, "audio")
        at_16k = self.buffer.append(pcm)
        if self.vad is None:
            return
        # Off the event loop (onnxruntime releases the GIL): ~0.2 ms a frame, 64 sessions would
        # take 40 % of the loop's time; the session's own events stay in order (awaited here).
        for vad_ev in await asyncio.to_thread(self.vad.feed, at_16k):
            if vad_ev.started:
                await self._speech_started(vad_ev.ms)
            else:
                await self.send("input_audio_buffer.speech_stopped", audio_end_ms=vad_ev.ms, item_id=self._next_item)
                item = await self._commit(self._next_item)
                try:
                    if self.settings.turns.create_response and self.response is None:
                        await self._start_response(None)
                finally:
                    self._transcribe(item)  # (after the answer's request: that goes first to the thinker)
        if not self.vad.speaking:
            self.buffer.keep_last(self.vad.settings.prefix_padding_ms)

    async def _speech_started(self, ms: int) -> None:
        self._next_item = new_id("item")
        t0 = time.monotonic()
        interrupted = self.response is not None and self.settings.turns.interrupt_response
        if interrupted:
            assert self.task is not None
            self.task.cancel()  # before speech_started: no delta of it can follow that event
        await self.send("input_audio_buffer.speech_started", audio_start_ms=ms, item_id=self._next_item)
        if interrupted:
            await self.cancel_response("turn_detected")
            self.last_barge_in_s = time.monotonic() - t0

    _next_item: str | None = None

    async def _commit(self, item_id: str | None) -> HistoryItem:
        if self.buffer.samples * 1000 < MIN_COMMIT_MS * 16_000:
            ms = self.buffer.samples // 16
            raise RealtimeError(f"buffer too small: {ms} ms of audio, at least {MIN_COMMIT_MS} ms",
                                "input_audio_buffer_commit_empty")  # fmt: skip
        item = HistoryItem(item_id or new_id("item"), "message", "user", audio=self.buffer.take())
        previous = self.history.last_id()
        await self.send("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous)
        await self._add(item, previous)
        return item

    def _transcribe(self, item: HistoryItem) -> None:
        if self.settings.transcription is not None and self.history.find(item.id) is not None:
            self.transcripts.start(item, self.history, self.settings.transcription)

    async def _add(self, item: HistoryItem, previous: str | None) -> None:
        for gone in self.history.add(item):
            await self.send("conversation.item.deleted", item_id=gone)
        body = _item_json(item)
        await self.send("conversation.item.added", previous_item_id=previous, item=body)
        await self.send("conversation.item.done", previous_item_id=previous, item=body)

    async def _item_create(self, ev: ItemCreate) -> None:
        fmt = self.settings.in_format
        max_b64 = int(self.cfg.max_turn_audio_s * fmt.rate * fmt.bytes_per_sample * 4 / 3) + 4
        item = _history_item(ev.item, max_b64, fmt)
        await self._add(item, self.history.last_id())

    async def _item_ref(self, kind: str, ev: ItemRef) -> None:
        """Delete an item from the conversation (LiveKit does, to sync its chat context), or send it back."""
        item = self.history.find(ev.item_id)
        if item is None:
            raise RealtimeError(f"no item {ev.item_id!r} in the conversation", "item_not_found", "item_id")
        if kind == "conversation.item.retrieve":
            await self.send("conversation.item.retrieved", item=_item_json(item))
            return
        if self.response is not None and (self.response.message is item or item in self.response.calls.values()):
            await self.cancel_response()
        self.history.items.remove(item)
        await self.send("conversation.item.deleted", item_id=item.id)

    async def _truncate(self, ev: Truncate) -> None:
        item = self.history.find(ev.item_id)
        if item is None or item.type != "message" or item.role != "assistant":
            raise RealtimeError(
                f"no assistant message {ev.item_id!r} in the conversation", "item_truncate_invalid_item_id", "item_id"
            )
        if self.response is not None and self.response.message is item:
            await self.cancel_response()
        if not 0 <= ev.audio_end_ms <= item.audio_ms:
            raise RealtimeError(f"audio_end_ms={ev.audio_end_ms} is past the item's {item.audio_ms} ms of audio",
                                "invalid_value", "audio_end_ms")  # fmt: skip
        item.text = played_prefix(item.text, ev.audio_end_ms, item.audio_ms)
        item.audio_ms = ev.audio_end_ms
        await self.send("conversation.item.truncated", item_id=item.id, content_index=ev.content_index,
                        audio_end_ms=ev.audio_end_ms)  # fmt: skip

    async def _response_create(self, ev: ResponseCreate) -> None:
        if self.response is not None:
            raise RealtimeError(
                f"response {self.response.id} is in progress", "conversation_already_has_active_response"
            )
        await self._start_response(ev.response)

    # ---- responses -------------------------------------------------------------------------

    async def _start_response(self, params: Any) -> None:
        s = self.settings
        audio = s.audio_out
        mods = None if params is None else (params.output_modalities or params.modalities)
        if mods is not None:
            audio = modalities_of(mods, self.srv.view.audio_stage is not None, "response.output_modalities")
        run = ResponseRun(self.send, self.history, audio, None if params is None else params.metadata, s.out_format)
        try:
            job, start = response_job(self.srv, s, self.history, params, audio)
        except ApiError as err:
            raise RealtimeError(err.body.error.message, err.code, err.body.error.param) from None
        for gone in self.history.items[:start]:  # over the token budget (omni_mp.http.realtime.budget)
            self.history.items.remove(gone)
            await self.send("conversation.item.deleted", item_id=gone.id)
        self.response = run
        await self.send("response.created", response=run.describe())
        events = self.srv.realtime_events(job)
        self.task = asyncio.create_task(self._respond(run, events))

    async def _respond(self, run: ResponseRun, events: Any) -> None:
        try:
            await run.run(events)
            await run.finish("completed")
        except ApiError as err:
            await run.finish("failed", api_error_body(err))
            await self.error(api_error_body(err))
        except (RuntimeError, OSError) as err:  # the client went away mid-send: close() follows
            log.info("realtime session %s: response %s not delivered (%s)", self.id, run.id, err)
        finally:
            await events.aclose()
            if self.response is run and not run.status == "in_progress":
                self.response, self.task = None, None

    async def cancel_response(self, reason: str = "client_cancelled") -> None:
        """Cancel the running response (its request aborted in every stage), then `response.done`."""
        run, task = self.response, self.task
        if run is None or task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.response, self.task = None, None
        if run.status == "in_progress":
            await run.finish("cancelled", reason=reason)

    async def close(self) -> None:
        """The client is gone: its response and transcriptions (if any) are aborted; nothing more is sent."""
        await self.transcripts.close()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError, OSError):
                await self.task
        self.response, self.task = None, None


def _history_item(it: Item, max_b64: int, fmt: WireFormat) -> HistoryItem:
    iid = it.id or new_id("item")
    if it.type == "function_call_output":
        if not it.call_id:
            raise RealtimeError("a function_call_output needs call_id", "invalid_value", "item.call_id")
        return HistoryItem(iid, "function_call_output", call_id=it.call_id, output=it.output or "")
    if it.type == "function_call":
        return HistoryItem(
            iid, "function_call", call_id=it.call_id or new_id("call"), name=it.name, arguments=it.arguments or "{}"
        )
    if it.type != "message" or it.role not in ("user", "assistant", "system"):
        raise RealtimeError(f"item type {it.type!r} role {it.role!r}: a user/assistant/system message, "
                            "function_call or function_call_output", "invalid_value", "item")  # fmt: skip
    texts, audios = [], []
    for j, part in enumerate(it.content or []):
        if part.type in ("input_text", "text", "output_text"):
            texts.append(part.text or "")
        elif part.type in ("input_audio", "audio", "output_audio") and it.role == "user" and part.audio:
            pcm = samples_of(part.audio, fmt, max_b64, f"item.content[{j}].audio")
            audios.append(to_model_rate(pcm, fmt.rate))
        elif part.type in ("audio", "output_audio"):
            texts.append(part.transcript or "")
        else:
            raise RealtimeError(
                f"content type {part.type!r} is not one this server takes", "invalid_value", f"item.content[{j}].type"
            )
    if not texts and not audios:
        raise RealtimeError("a message needs content", "invalid_value", "item.content")
    audio = np.concatenate(audios) if audios else None
    return HistoryItem(iid, "message", it.role, text="\n".join(texts), audio=audio)


def _item_json(it: HistoryItem) -> dict[str, Any]:
    base = {"id": it.id, "object": "realtime.item", "type": it.type, "status": it.status}
    if it.type == "function_call":
        return {**base, "call_id": it.call_id, "name": it.name, "arguments": it.arguments}
    if it.type == "function_call_output":
        return {**base, "call_id": it.call_id, "output": it.output}
    content: list[dict[str, Any]] = []
    if it.audio is not None:
        content.append({"type": "input_audio", "transcript": it.transcript})
    if it.text:
        kind = "input_text" if it.role in ("user", "system") else "output_text"
        content.append({"type": kind, "text": it.text})
    return {**base, "role": it.role, "content": content}

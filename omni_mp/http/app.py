"""The FastAPI app: routes, Bearer auth, body limits, and errors in OpenAI's shape.

Bodies are read (up to `max_body_bytes`, checked from Content-Length and while reading) and
decoded with msgspec against `schemas`; handlers raise `ApiError` for anything refused."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from omni_mp.client.omni_client import AsyncOmniClient, ClientClosed, RequestError
from omni_mp.config.schema import AudioIdsConfig, ClonedVoicesConfig
from omni_mp.http.audio_encode import MEDIA_TYPES
from omni_mp.http.audio_ids import AudioStore, MemoryAudioStore
from omni_mp.http.audio_ids_sqlite import SqliteAudioStore
from omni_mp.http.audio_out import SAMPLE_RATE, b64, wav_bytes
from omni_mp.http.chat import AudioDelta, ChatContext, ChatEnd, ChatJob, TextDelta, parse_chat, run_chat
from omni_mp.http.errors import ApiError, from_request_error, from_validation, too_large
from omni_mp.http.events import ChatEvent, as_api_errors, primed, tracked
from omni_mp.http.images import (
    image_events,
    image_size,
    parse_images,
    png_b64,
    run_images,
    stream_image,
)
from omni_mp.http.media import MediaSizes
from omni_mp.http.metrics import Metrics
from omni_mp.http.pipeline import PipelineView, voices_of
from omni_mp.http.realtime.route import add_realtime_route
from omni_mp.http.schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    ImageData,
    ImageGenerationRequest,
    ImagesResponse,
    MessageAudio,
    Model,
    ModelList,
    SpeechRequest,
    to_json,
)
from omni_mp.http.speech import parse_speech, run_speech, speech_bytes, speech_sse
from omni_mp.http.speech_clone import decode_clip
from omni_mp.http.sse import AbortingStream, ChunkMeta, SpokenAnswer, cancel_on_disconnect, chat_events
from omni_mp.http.transcriptions import add_transcription_route
from omni_mp.http.voice_store import VoiceStore
from omni_mp.http.voice_upload import clone_voice
from omni_mp.http.voices import VoiceList, Voices
from omni_mp.wire.messages import StageStatus, StatusReply

log = logging.getLogger("omni_mp.http")
T = TypeVar("T")

_PLAYGROUND = Path(__file__).resolve().parent / "static" / "playground.html"
CLIENT_GONE = 499  # the answer to a client that disconnected (nobody reads it)


class SharedStore(msgspec.Struct, frozen=True):
    path: str  # the SQLite file, in the server's private directory
    tag: str  # the server's id tag, the same in every worker
    voices_path: str = ":memory:"  # the cloned voices' SQLite file (omni_mp.http.voice_store)


class ServerSettings(msgspec.Struct, frozen=True):
    endpoint: str  # the coordinator's client endpoint
    model: str  # the name /v1/models lists (requests may name any model: there is one)
    api_key: str | None = None
    max_body_bytes: int = 64 << 20
    max_media_bytes: int = 32 << 20
    # Spoken answers kept for `assistant.audio.id` (omni_mp.http.audio_ids): bounds and lifetime.
    audio_ids: AudioIdsConfig = AudioIdsConfig()
    cloned_voices: ClonedVoicesConfig = ClonedVoicesConfig()  # POST /v1/audio/voices (omni_mp.http.voice_store)
    # A server of several worker processes (omni_mp.http.workers): the store they share.
    shared_store: SharedStore | None = None


def audio_store(settings: ServerSettings) -> AudioStore:
    """The audio-id store of this process: its own, or the one its server's workers share."""
    b = settings.audio_ids
    if settings.shared_store is None:
        return MemoryAudioStore(max_entries=b.max_entries, max_bytes=b.max_bytes, ttl_s=b.ttl_s)
    shared = settings.shared_store
    return SqliteAudioStore(
        shared.path, tag=shared.tag, max_entries=b.max_entries, max_bytes=b.max_bytes, ttl_s=b.ttl_s
    )


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(to_json(obj), status_code=status, media_type="application/json", headers=headers)


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large("body", int(declared), limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large("body", size, limit)
        parts.append(part)
    return b"".join(parts)


def _decode(raw: bytes, schema: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=schema)
    except msgspec.MsgspecError as err:
        raise from_validation(err) from None


class Server:
    """What the routes share: the coordinator client, the pipeline's view, metrics."""

    def __init__(self, settings: ServerSettings, view: PipelineView, tokenizer: Any) -> None:
        self.settings = settings
        self.view = view
        self.tokenizer = tokenizer
        self.metrics = Metrics(view)
        self.sizes = MediaSizes(max_media_bytes=settings.max_media_bytes)
        self.client: AsyncOmniClient | None = None
        self.voices = Voices([])  # once the stages serve: their voices and the aliases of them
        self.started = int(time.time())
        # One store for every request this server serves (see omni_mp.http.audio_ids).
        self.audio_ids = audio_store(settings)
        v = settings.cloned_voices
        where = ":memory:" if settings.shared_store is None else settings.shared_store.voices_path
        self.cloned = VoiceStore(where, max_entries=v.max_entries, max_bytes=v.max_bytes)
        template = None if tokenizer is None else functools.partial(tokenizer.apply_chat_template)
        self.chat = ChatContext(view, self.sizes, template, self.audio_ids, tokenizer)  # type: ignore[arg-type]
        self.realtime_sessions = 0  # open /v1/realtime WebSockets (omni_mp.http.realtime)

    @property
    def omni(self) -> AsyncOmniClient:
        assert self.client is not None, "the app is not started"
        return self.client

    def require_key(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        got = request.headers.get("authorization", "")
        if not (got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), key.encode())):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key")

    def events(self, job: ChatJob, endpoint: str, t0: float) -> AsyncIterator[ChatEvent]:
        rid = f"http-{uuid.uuid4().hex}"
        prompt_param = "messages" if endpoint == "chat" else "input"
        inner = as_api_errors(run_chat(self.omni, self.view, self.tokenizer, job, rid), prompt_param)
        return tracked(self.metrics, endpoint, t0, inner)

    def realtime_events(self, job: ChatJob) -> AsyncIterator[ChatEvent]:
        """A realtime response's stream (closing it aborts the request in every stage)."""
        return self.events(job, "realtime", time.monotonic())

    async def guarded(self, request: Request, coro: Any) -> Any:
        """Await `coro`; None once cancelled (its request aborted) if the client goes away first."""
        return await cancel_on_disconnect(request.receive, asyncio.ensure_future(coro))


def _assistant_message(end: ChatEnd, pcm: bytes, spoken: SpokenAnswer | None, audio_format: str) -> AssistantMessage:
    """A whole answer's message; a spoken one's audio stored under its id (omni_mp.http.audio_ids)."""
    audio = None
    if spoken is not None and end.spoken:
        data = wav_bytes(pcm, SAMPLE_RATE) if audio_format == "wav" else pcm
        spoken.store(end)
        audio = MessageAudio(id=spoken.id, data=b64(data), expires_at=spoken.expires_at, transcript=end.content or "")
    return AssistantMessage(role="assistant", content=end.content, audio=audio, tool_calls=end.tool_calls or None)


async def _collect(events: AsyncIterator[ChatEvent]) -> tuple[str, bytes, ChatEnd]:
    text, pcm, end = [], [], None
    async for ev in events:
        if isinstance(ev, TextDelta):
            text.append(ev.text)
        elif isinstance(ev, AudioDelta):
            pcm.append(ev.pcm)
        elif isinstance(ev, ChatEnd):
            end = ev
    assert end is not None
    return end.text, b"".join(pcm), end


def health_of(status: StatusReply) -> tuple[dict[str, Any], int]:
    """/health's answer: 200 while every stage has a replica that serves (`degraded` names the
    replicas down meanwhile), else 503 naming the stages that have none."""
    stages = [
        {"stage_id": s.stage_id, "replica": s.replica, "alive": s.alive, "ready": s.ready,
         "restarts": s.restarts, "failed": s.failed}
        for s in status.stages
    ]  # fmt: skip
    down = [s for s in status.stages if not (s.alive and s.ready)]
    serving = {s.stage_id for s in status.stages if s.alive and s.ready}
    if any(s.stage_id not in serving for s in down):
        names = ", ".join(f"{_name(s)} ({_why_down(s)})" for s in down if s.stage_id not in serving)
        return {"status": "unavailable", "reason": f"not serving: {names}", "stages": stages}, 503
    body: dict[str, Any] = {"status": "ok", "pipeline": status.pipeline, "inflight": status.inflight, "stages": stages}
    if down:  # some replicas are down, others of their stages serve
        body["degraded"] = ", ".join(f"{_name(s)} ({_why_down(s)})" for s in down)
    return body, 200


def _name(stage: StageStatus) -> str:
    return f"stage {stage.stage_id}" + (f" replica {stage.replica}" if stage.replica else "")


def _why_down(stage: StageStatus) -> str:
    if stage.failed is not None:  # its restart budget is spent: down for good
        return f"down for good: {stage.failed}"
    return "not ready" if stage.alive else "down, restarting"


def _routes(app: FastAPI, srv: Server) -> None:
    auth = [Depends(srv.require_key)]

    @app.get("/health")
    async def health() -> Response:
        try:
            status = await srv.omni.status(timeout_s=5.0)
        except TimeoutError:
            return _json({"status": "unavailable", "reason": "the coordinator does not answer"}, 503)
        except ClientClosed as err:  # this server can answer no request any more
            return _json({"status": "unavailable", "reason": f"the coordinator client is closed: {err}"}, 503)
        body, code = health_of(status)
        if code == 200:
            body["worker_pid"] = os.getpid()  # which of the server's processes answered (http.workers)
        return _json(body, code)

    @app.get("/")
    async def playground() -> Response:
        """The playground page (no secrets in it: the API calls it makes carry the key)."""
        return Response(playground_page(srv.settings.model, srv.view.voices), media_type="text/html; charset=utf-8")

    @app.get("/v1/models", dependencies=auth)
    async def models() -> Response:
        voices = srv.voices.names() if srv.view.audio_stage is not None else None
        model = Model(id=srv.settings.model, created=srv.started, owned_by="omni_mp", voices=voices)
        return _json(ModelList(data=[model]))

    @app.get("/metrics", dependencies=auth)
    async def metrics() -> Response:
        try:
            status = await srv.omni.status(timeout_s=5.0)
        except (TimeoutError, ClientClosed):
            status = None
        return Response(srv.metrics.render(status), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat(request: Request) -> Response:
        t0 = time.monotonic()
        try:
            req = _decode(await _body(request, srv.settings.max_body_bytes), ChatCompletionRequest)
            job = parse_chat(req, srv.chat)
        except ApiError as err:
            srv.metrics.outcome("chat", err.code)
            raise
        events = srv.events(job, "chat", t0)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        spoken = SpokenAnswer(srv.audio_ids) if job.audio_out else None
        if req.stream:
            events = await srv.guarded(request, primed(events))
            if events is None:
                return Response(status_code=CLIENT_GONE)
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            meta = ChunkMeta(cid, created, req.model, spoken, include_usage)
            return AbortingStream(chat_events(meta, events), media_type="text/event-stream")
        collected = await srv.guarded(request, _collect(events))
        if collected is None:
            return Response(status_code=CLIENT_GONE)
        _, pcm, end = collected
        message = _assistant_message(end, pcm, spoken, job.audio_format)
        choice = Choice(index=0, message=message, finish_reason=end.finish_reason)
        return _json(ChatCompletion(id=cid, created=created, model=req.model, choices=[choice], usage=end.usage))


def _audio_routes(app: FastAPI, srv: Server, auth: list[Any]) -> None:
    @app.get("/v1/audio/voices", dependencies=auth)
    async def voices() -> Response:
        """The model's voices, each with the aliases (OpenAI's voice names, ...) that mean it."""
        listing = srv.voices.listing(srv.started)
        return _json(VoiceList(data=[*listing.data, *srv.cloned.listing()]))

    @app.post("/v1/audio/voices", dependencies=auth)
    async def create_voice(request: Request) -> Response:
        """A cloned voice from an uploaded clip (OpenAI's custom-voice form), usable by its id."""
        return _json(await clone_voice(request, srv, _body))

    @app.post("/v1/audio/speech", dependencies=auth)
    async def speech(request: Request) -> Response:
        t0 = time.monotonic()
        try:
            req = _decode(await _body(request, srv.settings.max_body_bytes), SpeechRequest)
            job = parse_speech(req, srv.view, srv.voices, srv.cloned)
            if job.ref_audio is not None:  # decoded off the event loop
                clip = await asyncio.to_thread(decode_clip, job.ref_audio, srv.sizes, srv.view.media_limits)
                job = dataclasses.replace(job, clip=clip)
        except ApiError as err:
            srv.metrics.outcome("speech", err.code)
            raise
        rid = f"http-{uuid.uuid4().hex}"
        inner = as_api_errors(run_speech(srv.omni, srv.view, job, rid))
        events = await srv.guarded(request, primed(tracked(srv.metrics, "speech", t0, inner)))
        if events is None:
            return Response(status_code=CLIENT_GONE)
        headers = {"x-request-id": rid}  # OpenAI's header: clients (LiveKit's plugin) log it
        if job.sse:
            return AbortingStream(speech_sse(job, events), media_type="text/event-stream", headers=headers)
        return AbortingStream(speech_bytes(job, events), media_type=MEDIA_TYPES[job.fmt], headers=headers)


def _image_routes(app: FastAPI, srv: Server, auth: list[Any]) -> None:
    @app.post("/v1/images/generations", dependencies=auth)
    async def images(request: Request) -> Response:
        t0 = time.monotonic()
        code = "client_disconnected"
        try:
            req = _decode(await _body(request, srv.settings.max_body_bytes), ImageGenerationRequest)
            job = parse_images(req, srv.view)
            rid, created = f"http-{uuid.uuid4().hex}", int(time.time())
            if job.stream:
                first = await srv.guarded(request, primed(stream_image(srv.omni, job, rid)))
                if first is None:
                    return Response(status_code=CLIENT_GONE)
                code = "ok"  # (started: a failure from here on ends the stream with an error event)
                return AbortingStream(image_events(first, job.seed, created), media_type="text/event-stream")
            made = await srv.guarded(request, run_images(srv.omni, job, rid))
            if made is None:
                return Response(status_code=CLIENT_GONE)
            data = [ImageData(b64_json=await png_b64(pixels), seed=seed) for pixels, seed in made]
            code = "ok"
            return _json(ImagesResponse(created=created, data=data, size=image_size(made[0][0])))
        except RequestError as err:
            api = from_request_error(err)
            code = api.code
            raise api from None
        except ApiError as err:
            code = err.code
            raise
        finally:
            srv.metrics.outcome("images", code)
            srv.metrics.latency.labels(endpoint="images").observe(time.monotonic() - t0)


def playground_page(model: str, voices: list[str]) -> bytes:
    """static/playground.html with the pipeline's name and voices in its config block."""
    config = msgspec.json.encode({"model": model, "voices": voices}).replace(b"</", b"<\\/")
    return _PLAYGROUND.read_bytes().replace(b"__OMNI_MP_CONFIG__", config)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        return _json(err.body, err.status, err.headers)

    @app.exception_handler(ClientClosed)
    async def client_closed(request: Request, err: ClientClosed) -> Response:
        return _json(ApiError(503, str(err), type="server_error", code="client_closed").body, 503)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> Response:  # a bug here, not the client's fault
        log.exception("%s %s failed", request.method, request.url.path)
        body = ApiError(500, f"internal error: {type(err).__name__}", type="server_error", code="internal_error").body
        return _json(body, 500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        code = "not_found" if err.status_code == 404 else f"http_{err.status_code}"
        return _json(ApiError(err.status_code, str(err.detail), code=code).body, err.status_code)


def create_app(settings: ServerSettings, view: PipelineView, tokenizer: Any,
               client_factory: Callable[[], AsyncOmniClient] | None = None) -> FastAPI:  # fmt: skip
    srv = Server(settings, view, tokenizer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        srv.client = client_factory() if client_factory is not None else AsyncOmniClient(settings.endpoint)
        view.voices = voices_of(await srv.client.status())  # the pipeline serves before this starts
        srv.voices = Voices(view.voices, view.cfg.http.voice_aliases)  # a bad alias: the server does not start
        try:
            yield
        finally:
            await srv.client.close()
            srv.audio_ids.close()
            srv.cloned.close()

    app = FastAPI(title="omni_mp", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = srv
    _error_handlers(app)
    _routes(app, srv)
    _audio_routes(app, srv, [Depends(srv.require_key)])
    _image_routes(app, srv, [Depends(srv.require_key)])
    add_transcription_route(app, srv, [Depends(srv.require_key)], _body)
    add_realtime_route(app, srv)
    return app

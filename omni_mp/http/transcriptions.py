"""`POST /v1/audio/transcriptions`: OpenAI's speech-to-text endpoint on an omni pipeline.

The uploaded file (multipart form, as OpenAI's SDK sends it) is decoded here (omni_mp.http.
audio_in), and the thinker alone answers the family's transcription prompt
(omni_mp.models.transcription) for it, as a chat request with `modalities: ["text"]` does:
the request names the text stage as its only final stage. The answer is the transcript, as
JSON (`text`, `usage`), plain text, or server-sent events (`transcript.text.delta` as it is
written, then `transcript.text.done` with the whole text and the usage).

Every field of OpenAI's request is known (omni_mp.http.transcription_schemas); the ones this
server cannot honour are refused with a 400 that says why, never ignored:
timestamps (`timestamp_granularities[]`, and the formats that carry them: `srt`, `vtt`,
`verbose_json`), speakers (`known_speaker_names[]`/`_references[]`, `diarized_json`),
`include[]=logprobs`, `keywords[]`, `chunking_strategy` `server_vad` and more than one
`languages[]` entry. `chunking_strategy: "auto"` is accepted: the audio is transcribed as one
block (up to the entry stage's media limits; longer audio is refused, never cut)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException

from omni_mp.client.omni_client import AsyncOmniClient, ClientClosed, RequestError
from omni_mp.http.audio_in import AudioUploadError, decode_upload
from omni_mp.http.detok import Detokenizer
from omni_mp.http.errors import ApiError, bad_request, from_request_error, from_validation, too_large
from omni_mp.http.events import primed
from omni_mp.http.pipeline import PipelineView, Sampling
from omni_mp.http.sse import AbortingStream, event
from omni_mp.http.transcription_schemas import (
    LIST_FIELDS,
    InputTokenDetails,
    TextDeltaEvent,
    TextDoneEvent,
    Transcription,
    TranscriptionRequest,
    TranscriptionUsage,
)
from omni_mp.media.audio_io import MAX_READ_S
from omni_mp.models.registry import prompt_format
from omni_mp.models.transcription import LANGUAGES, SYSTEM_PROMPT_PARAM, Transcribes, TranscriptionPrompt
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageDone

if TYPE_CHECKING:
    from omni_mp.http.app import Server

ENDPOINT = "transcriptions"  # the metrics' label
RESPONSE_FORMATS = ("json", "text")
MAX_FIELDS = 64  # form parts in all (OpenAI's request has 14 fields; list fields repeat)
CLIENT_GONE = 499
_ARRAY = re.compile(r"^(?P<name>\w+)\[\]$")  # `include[]`
_MEMBER = re.compile(r"^(?P<name>\w+)\[(?P<key>\w+)\]$")  # `chunking_strategy[type]`
_REFUSED = {
    "timestamp_granularities": "timestamps are not supported: the model gives none (they need "
    "response_format verbose_json, which this server does not make)",
    "known_speaker_names": "speaker diarization is not supported: the model does not tell speakers apart",
    "known_speaker_references": "speaker diarization is not supported: the model does not tell speakers apart",
    "keywords": "keywords are not supported: the family's transcription prompt has no place for them "
    "(text in `prompt` follows the instruction)",
    "include": "include[]=logprobs is not supported: this server does not return log probabilities",
}


@dataclass
class TranscriptionJob:
    prompt: TranscriptionPrompt
    samples: np.ndarray
    rate: int
    stream: bool
    response_format: str
    sampling: dict[int, SamplingParamsMsg] = field(default_factory=dict)


@dataclass
class TranscriptEnd:
    text: str
    usage: TranscriptionUsage
    timings: list[StageDone]


async def read_form(request: Request, body: bytes) -> FormData:
    """The multipart form of an already read (size-checked) body."""
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        return await Request(request.scope, receive).form(max_files=1, max_fields=MAX_FIELDS)
    except (MultiPartException, StarletteHTTPException) as err:
        detail = getattr(err, "detail", None) or getattr(err, "message", str(err))
        raise bad_request(f"the multipart form does not parse: {detail}", None, "invalid_multipart") from None


def _fields(form: FormData) -> tuple[dict[str, Any], UploadFile]:
    """The form's text fields as the schema takes them (list fields from `name[]` parts,
    an object from `name[key]` parts), and the `file` upload."""
    data: dict[str, Any] = {}
    upload: UploadFile | None = None
    for key, value in form.multi_items():
        if key == "file":
            if not isinstance(value, UploadFile):
                raise bad_request("`file` must be a file upload (a form part with a filename)", "file")
            upload = value
            continue
        if isinstance(value, UploadFile):
            raise bad_request(f"`{key}` must be a text field, got a file upload", key)
        if (m := _MEMBER.match(key)) is not None:
            member = data.setdefault(m["name"], {})
            if not isinstance(member, dict) or m["key"] in member:
                raise bad_request(f"`{key}` given more than once, or beside `{m['name']}`", m["name"])
            member[m["key"]] = value
            continue
        name = m["name"] if (m := _ARRAY.match(key)) is not None else key
        if name in LIST_FIELDS:
            data.setdefault(name, []).append(value)
        elif name in data:
            raise bad_request(f"`{name}` given more than once", name)
        else:
            data[name] = value
    if upload is None:
        raise bad_request("a `file` upload is required (multipart/form-data)", "file")
    if "model" not in data:
        raise bad_request("`model` is required", "model")
    return data, upload


def _parse(data: dict[str, Any]) -> TranscriptionRequest:
    try:  # (strict=False: form values are strings: "0.2", "true")
        return msgspec.convert(data, TranscriptionRequest, strict=False)
    except msgspec.ValidationError as err:
        raise from_validation(err) from None


def _language(req: TranscriptionRequest) -> str | None:
    language = req.language
    if req.languages:
        if len(req.languages) > 1 or (language is not None and req.languages[0] != language):
            raise bad_request(
                "the transcription prompt names one language: give one `languages[]` entry or `language`", "languages"
            )
        language = req.languages[0]
    if language is not None and language not in LANGUAGES:
        raise bad_request(f"language {language!r} is not supported; supported: {sorted(LANGUAGES)}", "language")
    return language


def transcriber(view: PipelineView) -> Transcribes:
    """The thinker's transcription prompts, or a 400 saying why this pipeline does not transcribe
    (also the realtime sessions' transcripts of the user's turns: omni_mp.http.realtime.transcripts)."""
    stage = view.text_stage
    if stage is None or stage not in view.cfg.entry_stages:
        raise bad_request(f"pipeline {view.cfg.name!r} does not transcribe (no entry stage answers in text)", "model")
    fmt = prompt_format(stage.prompt_format) if stage.prompt_format is not None else None
    if not isinstance(fmt, Transcribes) or view.media_limits.max_audios < 1:
        raise bad_request(f"pipeline {view.cfg.name!r} does not transcribe (its thinker has no transcription prompt)",
                          "model", "unsupported_value")  # fmt: skip
    return fmt


def _prompt(req: TranscriptionRequest, view: PipelineView) -> TranscriptionPrompt:
    """Refuse what cannot be honoured (saying why), then the family's prompt for the rest."""
    fmt = transcriber(view)
    for name, why in _REFUSED.items():
        if getattr(req, name):
            raise bad_request(why, name, "unsupported_value")
    if req.response_format not in RESPONSE_FORMATS:
        raise bad_request(
            f"response_format {req.response_format!r}: supported are {list(RESPONSE_FORMATS)} (srt, vtt and "
            "verbose_json carry timestamps, diarized_json speakers: the model gives neither)",
            "response_format",
            "unsupported_value",
        )
    if req.chunking_strategy is not None and req.chunking_strategy != "auto":
        raise bad_request("chunking_strategy server_vad is not supported: the audio is transcribed as one block "
                          "(`auto` is accepted)", "chunking_strategy", "unsupported_value")  # fmt: skip
    return fmt.transcription(_language(req), req.prompt)


BodyReader = Callable[[Request, int], Awaitable[bytes]]  # the app's: the body, up to a limit (else a 400)


async def transcription_job(request: Request, srv: Server, read_body: BodyReader) -> TranscriptionJob:
    """The request's job, or an ApiError naming what is wrong (before anything reaches the pipeline)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request(f"Content-Type must be multipart/form-data, got {content_type or 'none'!r}", "content-type")
    form = await read_form(request, await read_body(request, srv.settings.max_body_bytes))
    try:
        data, upload = _fields(form)
        req = _parse(data)
        prompt = _prompt(req, srv.view)
        raw = await upload.read()
    finally:
        await form.close()
    if len(raw) > srv.sizes.max_media_bytes:
        raise too_large("file", len(raw), srv.sizes.max_media_bytes)
    max_s = srv.view.media_limits.max_audio_s
    try:  # (decoding is CPU work: off the event loop)
        samples, rate = await asyncio.to_thread(decode_upload, raw, max_s if max_s is not None else MAX_READ_S)
    except AudioUploadError as err:
        raise bad_request(f"file {upload.filename or ''!r}: {err}", "file") from None
    assert srv.view.text_stage is not None
    sampling = srv.view.sampling(Sampling(temperature=req.temperature), audio=False)
    return TranscriptionJob(prompt, samples, rate, req.stream, req.response_format, sampling)


def _usage(prompt_ids: list[int], output_tokens: int, audio_id: int | None) -> TranscriptionUsage:
    audio = sum(1 for t in prompt_ids if t == audio_id) if audio_id is not None else 0
    details = InputTokenDetails(text_tokens=len(prompt_ids) - audio, audio_tokens=audio)
    n = len(prompt_ids)
    return TranscriptionUsage(n, output_tokens, n + output_tokens, details)


async def run_transcription(
    client: AsyncOmniClient, view: PipelineView, tokenizer: Any, job: TranscriptionJob, request_id: str
) -> AsyncIterator[str | TranscriptEnd]:
    """The transcript's new text as the thinker writes it, then one TranscriptEnd; pipeline
    errors as ApiErrors. Leaving early (the caller closing this) aborts the request."""
    assert view.text_stage is not None
    stage_id = view.text_stage.id
    detok = Detokenizer(tokenizer, [])
    prompt_ids: list[int] = []
    timings: list[StageDone] = []
    params = None if job.prompt.system is None else {SYSTEM_PROMPT_PARAM: job.prompt.system}
    events = client.stream(
        job.prompt.text, audios=[(job.samples, job.rate)], params=params, sampling=job.sampling,
        request_id=request_id, final_stages=[stage_id],
    )  # fmt: skip
    try:
        async with aclosing(events):
            async for ev in events:
                if isinstance(ev, Finished):
                    timings = list(ev.stage_timings)
                    break
                if ev.stage_id != stage_id:
                    continue
                prompt_ids = list(ev.prompt_token_ids) if ev.prompt_token_ids else prompt_ids
                new = detok.add(list(ev.token_ids), ev.text if ev.finished else None)
                if new:
                    yield new
    except RequestError as err:
        raise from_request_error(err) from None
    audio_id = tokenizer.convert_tokens_to_ids(job.prompt.audio_token)
    yield TranscriptEnd(detok.text, _usage(prompt_ids, len(detok.ids), audio_id), timings)


async def _sse(events: AsyncIterator[str | TranscriptEnd]) -> AsyncIterator[bytes]:
    """`transcript.text.delta` events, then `transcript.text.done`; an error after the first
    event is sent as an error event (the status line is gone by then)."""
    try:
        async for ev in events:
            if isinstance(ev, str):
                yield event(msgspec.json.encode(TextDeltaEvent(delta=ev)))
            else:
                yield event(msgspec.json.encode(TextDoneEvent(text=ev.text, usage=ev.usage)))
    except (ApiError, ClientClosed) as err:
        body = err.body if isinstance(err, ApiError) else ApiError(503, str(err), code="client_closed").body
        yield event(msgspec.json.encode(body))
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def _last(events: AsyncIterator[str | TranscriptEnd]) -> TranscriptEnd:
    async with aclosing(events):  # type: ignore[type-var]
        async for ev in events:
            if isinstance(ev, TranscriptEnd):
                return ev
    raise AssertionError("run_transcription ends with a TranscriptEnd")


def add_transcription_route(app: FastAPI, srv: Server, auth: list[Any], read_body: BodyReader) -> None:
    @app.post("/v1/audio/transcriptions", dependencies=auth)
    async def transcriptions(request: Request) -> Response:
        t0, code = time.monotonic(), "client_disconnected"
        try:
            job = await transcription_job(request, srv, read_body)
            events = run_transcription(srv.omni, srv.view, srv.tokenizer, job, f"http-{uuid.uuid4().hex}")
            if job.stream:
                first = await srv.guarded(request, primed(events))
                if first is None:
                    return Response(status_code=CLIENT_GONE)
                code = "ok"  # (started: a failure from here on ends the stream with an error event)
                return AbortingStream(_sse(first), media_type="text/event-stream")
            end = await srv.guarded(request, _last(events))
            if end is None:
                return Response(status_code=CLIENT_GONE)
            srv.metrics.stage_timings(end.timings)
            code = "ok"
            if job.response_format == "text":
                return Response(end.text, media_type="text/plain; charset=utf-8")
            return Response(msgspec.json.encode(Transcription(end.text, end.usage)), media_type="application/json")
        except ApiError as err:
            code = err.code
            raise
        except ClientClosed:
            code = "client_closed"
            raise
        finally:
            srv.metrics.outcome(ENDPOINT, code)
            srv.metrics.latency.labels(endpoint=ENDPOINT).observe(time.monotonic() - t0)

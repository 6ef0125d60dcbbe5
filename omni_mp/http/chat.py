"""One chat request: the OpenAI body -> what the coordinator takes (`ChatJob`), and the
pipeline's stream -> text deltas, PCM16 audio chunks and the end (`run_chat`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_mp.client.omni_client import AsyncOmniClient
from omni_mp.http.audio_out import pcm16
from omni_mp.http.detok import Detokenizer
from omni_mp.http.errors import bad_request
from omni_mp.http.media import MediaSizes, decode_audio, decode_image
from omni_mp.http.pipeline import PipelineView, Sampling
from omni_mp.http.schemas import ChatCompletionRequest, ImageUrlPart, InputAudioPart, TextPart, Usage
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageDone, StageOutputChunk
from omni_mp.wire.outputs import audio_of

AUDIO_OUT_FORMATS = ("wav", "pcm16")


@dataclass
class ChatJob:
    prompt: str
    audios: list[tuple[np.ndarray, int]] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    audio_out: bool = False
    voice: str | None = None
    audio_format: str = "wav"
    final_stages: list[int] = field(default_factory=list)  # empty: every final stage
    sampling: dict[int, SamplingParamsMsg] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)


@dataclass
class TextDelta:
    text: str


@dataclass
class AudioDelta:
    pcm: bytes  # int16 little-endian, mono
    sample_rate: int


@dataclass
class ChatEnd:
    finish_reason: str
    usage: Usage
    text: str
    timings: list[StageDone]  # of the stages that finished it (empty when a stop string ended it)


def _user_turn(req: ChatCompletionRequest, view: PipelineView, sizes: MediaSizes) -> ChatJob:
    """The last message: one user turn (the model's chat format adds its own system prompt)."""
    if len(req.messages) != 1 or req.messages[0].role != "user":
        raise bad_request(
            "this pipeline takes one user message per request (its chat format has its own system prompt)",
            "messages",
            "unsupported_value",
        )
    content = req.messages[0].content
    if content is None:
        raise bad_request("the user message has no content", "messages[0].content")
    if isinstance(content, str):
        return ChatJob(prompt=content)
    job = ChatJob(prompt="")
    texts = []
    limits = view.media_limits
    for i, part in enumerate(content):
        param = f"messages[0].content[{i}]"
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, InputAudioPart):
            a = part.input_audio
            job.audios.append(decode_audio(a.data, a.format, sizes, limits, f"{param}.input_audio"))
        elif isinstance(part, ImageUrlPart):
            job.images.append(decode_image(part.image_url.url, sizes, limits, f"{param}.image_url.url"))
    if len(job.audios) > limits.max_audios or len(job.images) > limits.max_images:
        raise bad_request(f"at most {limits.max_audios} audios and {limits.max_images} images", "messages")
    job.prompt = "\n".join(texts)
    if not job.prompt.strip():
        raise bad_request("the user message needs some text", "messages[0].content")
    return job


def _audio_choice(req: ChatCompletionRequest, view: PipelineView, job: ChatJob) -> None:
    modalities = req.modalities or ["text"]
    if "text" not in modalities:
        raise bad_request("modalities must include 'text' (the answer is always written too)", "modalities")
    job.audio_out = "audio" in modalities
    if not job.audio_out:
        if req.audio is not None:
            raise bad_request("`audio` is given but modalities do not include 'audio'", "audio")
        job.final_stages = [view.text_stage.id]  # type: ignore[union-attr]  # a text answer: no stage after the text stage runs
        return
    if view.audio_stage is None:
        raise bad_request(f"pipeline {view.cfg.name!r} cannot speak", "modalities", "unsupported_value")
    if req.audio is None:
        raise bad_request("modalities include 'audio': give `audio: {voice, format}`", "audio")
    check_voice(req.audio.voice, view, "audio.voice")
    if req.audio.format not in AUDIO_OUT_FORMATS:
        raise bad_request(f"audio format {req.audio.format!r}: supported are {list(AUDIO_OUT_FORMATS)}", "audio.format")
    job.voice, job.audio_format = req.audio.voice, req.audio.format


def check_voice(voice: str, view: PipelineView, param: str) -> None:
    if voice not in view.voices:
        raise bad_request(f"unknown voice {voice!r}; this model's voices are {view.voices}", param)


def parse_chat(req: ChatCompletionRequest, view: PipelineView, sizes: MediaSizes) -> ChatJob:
    """Validate what the schema cannot, decode the media, map sampling onto the stages."""
    if view.text_stage is None:
        raise bad_request(
            f"pipeline {view.cfg.name!r} does not chat (it makes images: POST /v1/images/generations)",
            "model",
            "unsupported_value",
        )
    if req.n is not None and req.n != 1:
        raise bad_request("only n=1 is supported", "n", "unsupported_value")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options needs stream: true", "stream_options")
    job = _user_turn(req, view, sizes)
    _audio_choice(req, view, job)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    s = Sampling(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed)
    job.sampling = view.sampling(s, audio=job.audio_out)
    job.stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return job


def _chunk_pcm(info: Any) -> tuple[bytes, int] | None:
    got = audio_of(info)
    return (pcm16(np.asarray(got[0], dtype=np.float32)), got[1]) if got is not None else None


def _finish_reason(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


async def run_chat(
    client: AsyncOmniClient, view: PipelineView, tokenizer: Any, job: ChatJob, request_id: str
) -> AsyncIterator[TextDelta | AudioDelta | ChatEnd]:
    """The request's text and audio as they are produced, then one ChatEnd. Leaving early
    (a stop string, or the caller closing this generator) aborts it in every stage."""
    assert view.text_stage is not None  # (parse_chat refused the request otherwise)
    detok = Detokenizer(tokenizer, job.stop)
    prompt_tokens, reason, timings = 0, "stop", []
    events = client.stream(
        job.prompt,
        audios=job.audios,
        images=job.images,
        speaker=job.voice,
        sampling=job.sampling,
        request_id=request_id,
        final_stages=job.final_stages,
    )
    async with aclosing(events):
        async for ev in events:
            if isinstance(ev, Finished):
                timings = list(ev.stage_timings)
                break
            assert isinstance(ev, StageOutputChunk)
            if ev.stage_id == view.text_stage.id:
                prompt_tokens += len(ev.prompt_token_ids or ())
                new = detok.add(list(ev.token_ids), ev.text if ev.finished else None)
                if new:
                    yield TextDelta(new)
                if ev.finished:
                    reason = _finish_reason(ev.finish_reason)
                if detok.stopped:
                    reason = "stop"
                    break  # leaving the stream aborts the rest of the request
            elif job.audio_out and view.audio_stage is not None and ev.stage_id == view.audio_stage.id:
                got = _chunk_pcm(ev.additional_information)
                if got is not None:
                    yield AudioDelta(*got)
    n = len(detok.ids)
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=n, total_tokens=prompt_tokens + n)
    yield ChatEnd(reason, usage, detok.text, timings)

"""POST /v1/audio/speech: the model speaks exactly `input`.

A speech model (PipelineView.speech_only: Qwen3-TTS) takes `input` as its prompt, `voice` as its
preset voice and `instructions` as how to speak (its entry stage's prompt format builds the
talker's input from them). An omni model:

The thinker is not asked to read the text (it would answer it): the text goes in as the
assistant's turn (Submit.forced_reply) after a user turn asking for it (SPEECH_REQUEST), so the
thinker stage prefills it as if it had written it and generates only the turn's end; the
talker then voices those tokens as it voices any reply (the reference implementation's
thinker -> talker hand-off, given these reply tokens). The audio stage's chunks are encoded as
they come (omni_mp.http.audio_encode) and sent as bytes (`stream_format: "audio"`, the
default) or as OpenAI's `speech.audio.delta` / `speech.audio.done` events (`"sse"`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from omni_mp.client.omni_client import AsyncOmniClient
from omni_mp.http.audio_encode import FORMATS, MAX_SPEED, MIN_SPEED, SpeechEncoder
from omni_mp.http.audio_out import SAMPLE_RATE, b64, pcm16
from omni_mp.http.chat import AudioDelta, ChatEnd
from omni_mp.http.errors import ApiError, bad_request
from omni_mp.http.pipeline import PipelineView
from omni_mp.http.schemas import SpeechRequest, Usage, VoiceRef, to_json
from omni_mp.http.speech_clone import talker_sampling, tts_params
from omni_mp.http.sse import event
from omni_mp.http.voice_store import VoiceStore
from omni_mp.http.voices import Voices
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageDone, StageOutputChunk
from omni_mp.wire.outputs import audio_of

log = logging.getLogger("omni_mp.http")

# The user turn the given reply answers: a request whose natural answer is the text itself.
SPEECH_REQUEST = "Read the following text aloud, word for word:\n\n{input}"
DEFAULT_FORMAT = "mp3"  # OpenAI's
STREAM_FORMATS = ("audio", "sse")


@dataclass(frozen=True)
class SpeechJob:
    prompt: str  # the user turn
    text: str  # what is spoken: the assistant's turn
    voice: str | None  # one of the model's (None: a cloned voice)
    fmt: str
    sse: bool
    speed: float
    params: dict[str, Any] | None = None  # a speech model's (Qwen3-TTS): instructions, cloning fields
    ref_audio: str | None = None  # the clip to clone as sent (decoded off the event loop: `clip`)
    clip: tuple[np.ndarray, int] | None = None  # mono float32 samples and their rate
    sampling: dict[int, SamplingParamsMsg] | None = None  # max_new_tokens


class SpeechDelta(msgspec.Struct):
    audio: str  # base64 bytes of the response format, in order
    type: str = "speech.audio.delta"


class SpeechUsage(msgspec.Struct):
    input_tokens: int  # the thinker's: the prompt and the given text
    output_tokens: int  # the talker's steps (codec ids, or frames)
    total_tokens: int


class SpeechDone(msgspec.Struct):
    usage: SpeechUsage
    type: str = "speech.audio.done"


_TTS_FIELDS = ("task_type", "language", "max_new_tokens", "ref_audio", "ref_text", "x_vector_only_mode",
               "non_streaming_mode")  # fmt: skip
_NO_INSTRUCTIONS = (
    "this model's talker takes no instructions: Qwen2.5-Omni and Qwen3-Omni voice the text in the chosen "
    "voice only (leave `instructions` out, or empty)"
)


def parse_speech(req: SpeechRequest, view: PipelineView, voices: Voices, store: VoiceStore | None = None) -> SpeechJob:
    """Validate what the schema cannot; every refusal names its field. `store`: the cloned voices
    a speech model's request may name by id (omni_mp.http.voice_store)."""
    if view.audio_stage is None or (view.text_stage is None and not view.speech_only):
        raise bad_request(f"pipeline {view.cfg.name!r} cannot speak", "model", "unsupported_value")
    if not req.input.strip():
        raise bad_request("`input` has no text to speak", "input")
    if not view.speech_only and any(getattr(req, f) is not None for f in _TTS_FIELDS):
        given = [f for f in _TTS_FIELDS if getattr(req, f) is not None]
        raise bad_request(
            f"{given}: fields of a speech model (Qwen3-TTS); this pipeline speaks its talker's voices", given[0]
        )
    name = req.voice.id if isinstance(req.voice, VoiceRef) else req.voice
    stored = store.get(name) if view.speech_only and req.ref_audio is None and store is not None else None
    cloned = view.speech_only and (req.ref_audio is not None or stored is not None)
    voice = None if cloned else voices.resolve(name)  # a clip: its own voice
    if voice is None and not cloned:
        param = "voice.id" if isinstance(req.voice, VoiceRef) else "voice"
        hint = " (a Base model: clone a voice with ref_audio)" if view.speech_task == "Base" else ""
        raise bad_request(f"unknown voice {name!r}; this model's voices are {voices.names()}{hint}", param)
    fmt = req.response_format or DEFAULT_FORMAT
    if fmt not in FORMATS:
        raise bad_request(f"response_format {fmt!r}: supported are {list(FORMATS)}", "response_format")
    stream = req.stream_format or "audio"
    if stream not in STREAM_FORMATS:
        raise bad_request(f"stream_format {stream!r}: supported are {list(STREAM_FORMATS)}", "stream_format")
    speed = 1.0 if req.speed is None else req.speed
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise bad_request(f"speed {speed}: from {MIN_SPEED} to {MAX_SPEED}", "speed")
    if view.speech_only:  # the model speaks `input` itself, in the voice and manner asked
        params = tts_params(req, view.speech_task, stored) or None
        sampling = talker_sampling(req, view)
        clip = None if stored is None else (stored.samples, stored.rate)
        return SpeechJob(
            req.input, req.input, voice, fmt, stream == "sse", speed, params, req.ref_audio, clip, sampling
        )
    if req.instructions and req.instructions.strip():
        raise bad_request(_NO_INSTRUCTIONS, "instructions", "unsupported_value")
    prompt = SPEECH_REQUEST.format(input=req.input)
    return SpeechJob(prompt=prompt, text=req.input, voice=voice, fmt=fmt, sse=stream == "sse", speed=speed)


def _usage(view: PipelineView, timings: list[StageDone]) -> Usage:
    """The thinker's tokens in (its prompt and the given text it prefilled), the talker's out."""
    by_stage = {d.stage_id: d for d in timings}
    assert view.audio_stage is not None
    if view.speech_only:  # the talker's prompt rows in, its steps out
        talkers = [by_stage[s] for s in view.audio_stage.inputs if s in by_stage]
        n_in, n_out = sum(d.num_prompt_tokens for d in talkers), sum(d.num_output_tokens for d in talkers)
        return Usage(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out)
    assert view.text_stage is not None
    thinker = by_stage.get(view.text_stage.id)
    talkers = [by_stage[s] for s in view.audio_stage.inputs if s in by_stage]
    n_in = 0 if thinker is None else thinker.num_prompt_tokens + thinker.num_output_tokens
    n_out = sum(d.num_output_tokens for d in talkers)
    return Usage(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out)


async def run_speech(
    client: AsyncOmniClient, view: PipelineView, job: SpeechJob, request_id: str
) -> AsyncIterator[AudioDelta | ChatEnd]:
    """The audio stage's PCM16 chunks as they are made, then one ChatEnd (leaving early aborts
    the request in every stage)."""
    assert view.audio_stage is not None
    if view.speech_only:  # a speech model: the text as the prompt, its instructions as params
        events = client.stream(
            job.text,
            speaker=job.voice,
            params=job.params,
            audios=[job.clip] if job.clip is not None else (),
            sampling=job.sampling,  # type: ignore[arg-type]
            request_id=request_id,
            final_stages=[view.audio_stage.id],
        )
    else:
        events = client.stream(
            job.prompt,
            forced_reply=job.text,
            speaker=job.voice,
            request_id=request_id,
            final_stages=[view.audio_stage.id],  # the thinker and talker run on its way; only audio comes back
        )
    async with aclosing(events):
        async for ev in events:
            if isinstance(ev, Finished):
                yield ChatEnd("stop", _usage(view, list(ev.stage_timings)), job.text, list(ev.stage_timings))
                return
            assert isinstance(ev, StageOutputChunk)
            got = audio_of(ev.additional_information)
            if got is None:
                continue
            if got[1] != SAMPLE_RATE:
                raise ApiError(500, f"the audio stage makes {got[1]} Hz, not {SAMPLE_RATE}", type="server_error")
            yield AudioDelta(pcm16(got[0]), got[1])


async def speech_bytes(job: SpeechJob, events: AsyncIterator[AudioDelta | ChatEnd]) -> AsyncIterator[bytes]:
    """The response body of `stream_format: "audio"`: the format's bytes as they are made."""
    enc = SpeechEncoder(job.fmt, job.speed)
    try:
        async for ev in events:
            if isinstance(ev, AudioDelta) and (out := enc.encode(ev.pcm)):
                yield out
        yield enc.finish()
    except ApiError as err:  # the status line is sent: the audio ends short
        log.warning("speech request failed after its first bytes: %s", err)


async def speech_sse(job: SpeechJob, events: AsyncIterator[AudioDelta | ChatEnd]) -> AsyncIterator[bytes]:
    """`stream_format: "sse"`: a `speech.audio.delta` per encoded piece, then `speech.audio.done`
    with the usage; an error after the first event is an `error` event."""
    enc = SpeechEncoder(job.fmt, job.speed)
    try:
        end = None
        async for ev in events:
            if isinstance(ev, AudioDelta):
                if out := enc.encode(ev.pcm):
                    yield event(to_json(SpeechDelta(audio=b64(out))))
            else:
                end = ev
        if out := enc.finish():
            yield event(to_json(SpeechDelta(audio=b64(out))))
        assert end is not None
        u = end.usage
        usage = SpeechUsage(
            input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens, total_tokens=u.total_tokens
        )
        yield event(to_json(SpeechDone(usage=usage)))
    except ApiError as err:
        yield event(to_json(err.body))

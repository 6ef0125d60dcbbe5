"""One chat request: the OpenAI body -> what the coordinator takes (`ChatJob`), and the
pipeline's stream -> text deltas, PCM16 audio chunks and the end (`run_chat`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from omni_mp.client.omni_client import AsyncOmniClient
from omni_mp.http.audio_ids import AudioStore
from omni_mp.http.audio_out import pcm16
from omni_mp.http.conversation import Template, TextItem, from_messages, render
from omni_mp.http.detok import Detokenizer
from omni_mp.http.errors import bad_request
from omni_mp.http.media import MediaSizes
from omni_mp.http.pipeline import PipelineView, Sampling
from omni_mp.http.schemas import (
    ChatCompletionRequest,
    DeltaToolCall,
    NamedToolChoice,
    PromptTokensDetails,
    ToolCall,
    Usage,
)
from omni_mp.http.vllm_hooks_tools import ToolCallReader, structural_tag
from omni_mp.models.family import ChatPolicy
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
    chat_formatted: bool = False  # `prompt` is a rendered conversation (omni_mp.http.conversation)
    tools: list[dict[str, Any]] | None = None  # the answer's tool calls are parsed (tool_choice not "none")
    tool_choice: Any = None
    parallel_tool_calls: bool = True  # False: one call at most (the first)


@dataclass
class TextDelta:
    text: str


@dataclass
class ToolCallsDelta:
    calls: list[DeltaToolCall]


@dataclass
class AudioDelta:
    pcm: bytes  # int16 little-endian, mono
    sample_rate: int


@dataclass
class ChatEnd:
    finish_reason: str
    usage: Usage
    text: str  # the whole answer as the model wrote it
    timings: list[StageDone]  # of the stages that finished it (empty when a stop string ended it)
    content: str | None = None  # the answer without its tool calls
    tool_calls: list[ToolCall] = field(default_factory=list)
    spoken: bool = False  # audio came out


@dataclass(frozen=True)
class ChatContext:
    """What parsing a chat request needs besides the request: the server's parts."""

    view: PipelineView
    sizes: MediaSizes
    template: Template  # the checkpoint's chat template (its tokenizer's apply_chat_template)
    audio_ids: AudioStore
    tokenizer: Any = None  # to count the prompt's tokens against the context


def _tools_of(req: ChatCompletionRequest, policy: ChatPolicy) -> list[dict[str, Any]] | None:
    """The request's tools as the template and parser take them; None when none are in play."""
    if req.tools is None:
        if req.tool_choice not in (None, "none"):
            raise bad_request("tool_choice needs `tools`", "tool_choice")
        return None
    if not policy.tools:
        raise bad_request("this model's chat template has no tools", "tools", "unsupported_value")
    names = [t.function.name for t in req.tools]
    if isinstance(req.tool_choice, NamedToolChoice) and req.tool_choice.function.name not in names:
        raise bad_request(
            f"tool_choice names {req.tool_choice.function.name!r}, not one of `tools` {names}",
            "tool_choice.function.name",
        )
    if req.tool_choice == "none":
        return None  # the model is not told of them: it cannot call one
    return [msgspec.to_builtins(t) for t in req.tools]


def _check_context(text: str, ctx: ChatContext) -> None:
    """A conversation longer than the thinker's context is refused before it is sent (its
    text's tokens; each medium then adds its own, which vLLM checks)."""
    limit = ctx.view.max_model_len
    if limit is None or ctx.tokenizer is None:
        return
    n = len(ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
    if n >= limit:
        raise bad_request(
            f"the conversation is {n} tokens, more than the model's context of {limit}",
            "messages",
            "context_length_exceeded",
        )


def _conversation(req: ChatCompletionRequest, ctx: ChatContext, job: ChatJob) -> None:
    """The whole message list -> the thinker's prompt, into `job`."""
    view = ctx.view
    policy = view.chat_policy
    conv = from_messages(req.messages, ctx.sizes, view.media_limits, ctx.audio_ids)
    if not view.has_chat_format:  # a plain LM: one user message, its text as the prompt
        turn = conv.turns[0]
        if len(conv.turns) != 1 or conv.audios or conv.images or req.tools is not None:
            raise bad_request("this pipeline has no chat format: one user text message per request", "messages")
        job.prompt = "\n".join(it.text for it in turn.items if isinstance(it, TextItem))
        return
    if ctx.template is None:
        # No tokenizer in this server (a stage with skip_tokenizer_init): the thinker stage
        # renders one user turn in its own prompt format; a longer conversation needs the template.
        turn = conv.turns[0]
        if len(conv.turns) != 1 or turn.role != "user" or req.tools is not None:
            why = "this server has no chat template (no tokenizer): one user message per request"
            raise bad_request(why, "messages")
        job.prompt = "\n".join(it.text for it in turn.items if isinstance(it, TextItem))
        job.audios, job.images = list(conv.audios), list(conv.images)
        return
    conv.tools = job.tools = _tools_of(req, policy)
    job.tool_choice = req.tool_choice if job.tools is not None else None
    job.parallel_tool_calls = req.parallel_tool_calls is not False
    prompt = render(conv, policy, ctx.template, speak=job.audio_out)
    _check_context(prompt.text, ctx)
    job.prompt, job.audios, job.images, job.chat_formatted = prompt.text, prompt.audios, prompt.images, True


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


def parse_chat(req: ChatCompletionRequest, ctx: ChatContext) -> ChatJob:
    """Validate what the schema cannot, render the conversation, map sampling onto the stages."""
    view = ctx.view
    if view.speech_only:
        raise bad_request(
            f"pipeline {view.cfg.name!r} does not chat: it speaks the text it is given (POST /v1/audio/speech)",
            "model",
            "unsupported_value",
        )
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
    job = ChatJob(prompt="")
    _audio_choice(req, view, job)
    _conversation(req, ctx, job)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    s = Sampling(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed)
    job.sampling = view.sampling(s, audio=job.audio_out)
    if job.tools is not None:
        tag = structural_tag(job.tools, msgspec.to_builtins(job.tool_choice), parallel=job.parallel_tool_calls)
        if tag is not None:  # a forced call, written in the model's own format
            text_id = view.text_stage.id
            base = job.sampling.get(text_id, view.text_stage.sampling)
            job.sampling[text_id] = msgspec.structs.replace(base, structural_tag=tag)
    job.stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return job


def _chunk_pcm(info: Any) -> tuple[bytes, int] | None:
    got = audio_of(info)
    return (pcm16(np.asarray(got[0], dtype=np.float32)), got[1]) if got is not None else None


def _finish_reason(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


async def run_chat(
    client: AsyncOmniClient, view: PipelineView, tokenizer: Any, job: ChatJob, request_id: str
) -> AsyncIterator[TextDelta | ToolCallsDelta | AudioDelta | ChatEnd]:
    """The request's text and audio as they are produced, then one ChatEnd. Leaving early
    (a stop string, or the caller closing this generator) aborts it in every stage. With tools,
    the text goes through the tool parser: content deltas, then tool-call deltas."""
    assert view.text_stage is not None  # (parse_chat refused the request otherwise)
    detok = Detokenizer(tokenizer, job.stop)
    reader = None
    if job.tools is not None:
        choice = msgspec.to_builtins(job.tool_choice)
        reader = ToolCallReader(tokenizer, job.tools, choice, parallel=job.parallel_tool_calls)
    prompt_tokens, reason, timings, spoken = 0, "stop", [], False
    events = client.stream(
        job.prompt,
        audios=job.audios,
        images=job.images,
        speaker=job.voice,
        sampling=job.sampling,
        request_id=request_id,
        final_stages=job.final_stages,
        chat_formatted=job.chat_formatted,
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
                if reader is not None and (new or ev.token_ids):
                    content, calls = reader.delta(new, list(ev.token_ids))
                    if content:
                        yield TextDelta(content)
                    if calls:
                        yield ToolCallsDelta(calls)
                elif new:
                    yield TextDelta(new)
                if ev.finished:
                    reason = _finish_reason(ev.finish_reason)
                if detok.stopped:
                    reason = "stop"
                    break  # leaving the stream aborts the rest of the request
            elif job.audio_out and view.audio_stage is not None and ev.stage_id == view.audio_stage.id:
                got = _chunk_pcm(ev.additional_information)
                if got is not None:
                    spoken = True
                    yield AudioDelta(*got)
    n = len(detok.ids)
    cached = next((d.num_cached_tokens for d in timings if d.stage_id == view.text_stage.id), 0)
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=n, total_tokens=prompt_tokens + n,
                  prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))  # fmt: skip
    content, calls = (detok.text, []) if reader is None else reader.final(detok.text)
    if calls:
        reason = "tool_calls"
    yield ChatEnd(reason, usage, detok.text, timings, content=content, tool_calls=calls, spoken=spoken)

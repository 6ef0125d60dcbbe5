"""`/v1/audio/transcriptions`: OpenAI's request fields (a multipart form) and the response and
stream events, as msgspec Structs. Every field of OpenAI's request is known here; what this
server does with each is in omni_mp.http.transcriptions (accepted, or refused saying why)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

Name = Annotated[str, Meta(max_length=256)]
Names = Annotated[list[Name], Meta(max_length=64)]


class ServerVad(msgspec.Struct, forbid_unknown_fields=True):
    """`chunking_strategy` as an object (OpenAI's voice-activity settings)."""

    type: Literal["server_vad"]
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    threshold: float | None = None


class TranscriptionRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The form's fields but `file` (list fields by their names without `[]`)."""

    model: Name
    language: Annotated[str, Meta(min_length=1, max_length=16)] | None = None
    languages: Names | None = None
    prompt: Annotated[str, Meta(max_length=16384)] | None = None
    response_format: Name = "json"
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    stream: bool = False
    timestamp_granularities: Names | None = None
    include: Names | None = None
    chunking_strategy: Literal["auto"] | ServerVad | None = None
    keywords: Names | None = None
    known_speaker_names: Names | None = None
    known_speaker_references: Annotated[list[str], Meta(max_length=4)] | None = None


# The fields that take several values (`name[]` parts in the form, as OpenAI's SDK sends them).
LIST_FIELDS = frozenset(
    {"languages", "timestamp_granularities", "include", "keywords", "known_speaker_names", "known_speaker_references"}
)


class InputTokenDetails(msgspec.Struct):
    text_tokens: int
    audio_tokens: int


class TranscriptionUsage(msgspec.Struct):
    """OpenAI's token usage: the thinker's prompt (its audio placeholder tokens apart) and answer."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_token_details: InputTokenDetails
    type: str = "tokens"


class Transcription(msgspec.Struct):
    text: str
    usage: TranscriptionUsage


class TextDeltaEvent(msgspec.Struct):
    delta: str
    type: str = "transcript.text.delta"


class TextDoneEvent(msgspec.Struct):
    text: str
    usage: TranscriptionUsage
    type: str = "transcript.text.done"

"""OpenAI Realtime protocol messages as msgspec Structs: the client events this server takes and
the server events it sends, in both spellings of the API.

GA (the default) and beta (a handshake with `OpenAI-Beta: realtime=v1`) differ in a few server
event names (`BETA_NAMES`) and in the session's shape: beta's is flat (`modalities`, `voice`,
`input_audio_format`, `turn_detection`, ...), GA's nests audio (`audio.input.format`,
`audio.output.voice`, ...). Client events are taken in either shape in either dialect.

Decoding is lenient on purpose: a field OpenAI's schema has and this server does not act on
(a transcription model, `tracing`, `truncation`, `max_output_tokens: "inf"`, ...) is accepted and
ignored (docs/http.md lists them), since stock clients (LiveKit) send them; a field of the wrong
type is an `invalid_request_error` naming it."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

# GA name -> beta name, for the server events that were renamed.
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}


# ---- client events -----------------------------------------------------------------------------


class Envelope(msgspec.Struct):
    type: str
    event_id: str | None = None


class AudioFormat(msgspec.Struct):
    """GA's format object; beta spells it as a string ("pcm16", "g711_ulaw", "g711_alaw")."""

    type: str = "audio/pcm"
    rate: int | None = None


Format = str | AudioFormat


class TurnDetection(msgspec.Struct):
    type: str = "server_vad"  # "semantic_vad" is taken as server_vad (documented)
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None  # accepted, not acted on
    eagerness: str | None = None  # semantic_vad's: accepted, not acted on


class Transcription(msgspec.Struct):
    """Transcripts of the user's audio turns (the thinker's transcription, whatever `model` says)."""

    model: str | None = None  # accepted: the thinker transcribes
    language: str | None = None  # the transcription prompt's language (an ISO code)
    prompt: Annotated[str, Meta(max_length=16384)] | None = None  # context after the instruction (the endpoint's bound)
    delay: Any = None  # accepted, not acted on
    keywords: Any = None  # accepted, not acted on
    languages: Any = None  # accepted, not acted on


class AudioInput(msgspec.Struct):
    format: Format | None = None
    turn_detection: TurnDetection | None | msgspec.UnsetType = msgspec.UNSET
    transcription: Transcription | None | msgspec.UnsetType = msgspec.UNSET  # null: off
    noise_reduction: Any = None  # accepted, not acted on


class AudioOutput(msgspec.Struct):
    format: Format | None = None
    voice: str | None = None
    speed: float | None = None  # accepted, not acted on


class AudioConfig(msgspec.Struct):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class Tool(msgspec.Struct):
    """A realtime function tool (flat: name, description, parameters)."""

    name: str
    type: str = "function"
    description: str | None = None
    parameters: dict[str, Any] | None = None


class SessionConfig(msgspec.Struct):
    """`session.update`'s `session`, GA and beta fields together."""

    type: str | None = None  # GA: "realtime"
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[str] | None = None  # GA
    modalities: list[str] | None = None  # beta
    audio: AudioConfig | None = None  # GA
    voice: str | None = None  # beta
    input_audio_format: Format | None = None  # beta
    output_audio_format: Format | None = None  # beta
    turn_detection: TurnDetection | None | msgspec.UnsetType = msgspec.UNSET  # beta
    tools: list[Tool] | None = None
    tool_choice: Any = None
    temperature: float | None = None
    max_output_tokens: int | str | None = None  # GA; "inf": the model's own limit
    max_response_output_tokens: int | str | None = None  # beta
    input_audio_transcription: Transcription | None | msgspec.UnsetType = msgspec.UNSET  # beta; null: off
    # Accepted, not acted on (docs/http.md):
    input_audio_noise_reduction: Any = None
    tracing: Any = None
    truncation: Any = None
    include: Any = None
    prompt: Any = None
    parallel_tool_calls: Any = None
    reasoning: Any = None
    speed: Any = None


class SessionUpdate(msgspec.Struct):
    session: SessionConfig


class Append(msgspec.Struct):
    audio: str


class ContentPart(msgspec.Struct):
    type: str  # input_text, input_audio, text/output_text, audio/output_audio
    text: str | None = None
    audio: str | None = None  # base64, in the session's input format
    transcript: str | None = None


class Item(msgspec.Struct):
    type: str = "message"  # message, function_call, function_call_output
    id: str | None = None
    role: str | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    object: str | None = None
    status: str | None = None


class ItemCreate(msgspec.Struct):
    item: Item
    previous_item_id: str | None = None


class ItemRef(msgspec.Struct):
    item_id: str


class Truncate(msgspec.Struct):
    item_id: str
    content_index: int
    audio_end_ms: int


class ResponseParams(msgspec.Struct):
    instructions: str | None = None
    output_modalities: list[str] | None = None
    modalities: list[str] | None = None
    metadata: dict[str, str] | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    max_output_tokens: int | str | None = None
    max_response_output_tokens: int | str | None = None
    voice: str | None = None
    audio: AudioConfig | None = None
    conversation: Any = None  # only "auto" (the session's) is acted on
    input: Any = None  # accepted, not acted on
    temperature: float | None = None


class ResponseCreate(msgspec.Struct):
    response: ResponseParams | None = None


class ResponseCancel(msgspec.Struct):
    response_id: str | None = None


class Empty(msgspec.Struct):
    pass


CLIENT_EVENTS: dict[str, type[msgspec.Struct]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": Append,
    "input_audio_buffer.commit": Empty,
    "input_audio_buffer.clear": Empty,
    "conversation.item.create": ItemCreate,
    "conversation.item.truncate": Truncate,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
    "conversation.item.delete": ItemRef,
    "conversation.item.retrieve": ItemRef,
    "output_audio_buffer.clear": Empty,  # (WebRTC's; nothing is buffered here: acknowledged)
}


# ---- server events -----------------------------------------------------------------------------


class ErrorBody(msgspec.Struct, omit_defaults=True):
    type: str
    code: str
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event it answers


class RealtimeError(Exception):
    """A client event refused: sent as an `error` event; the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 type: str = "invalid_request_error") -> None:  # fmt: skip
        super().__init__(message)
        self.body = ErrorBody(type=type, code=code, message=message, param=param)


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_token_details: dict[str, int] = {}
    output_token_details: dict[str, int] = {}


class ServerEvent(msgspec.Struct, omit_defaults=True):
    """Every server event: `type` and `event_id`, and whatever of these fields it carries."""

    type: str
    event_id: str
    session: Any = None
    item: Any = None
    item_id: str | None = None
    previous_item_id: str | None = None
    response: Any = None
    response_id: str | None = None
    output_index: int | None = None
    content_index: int | None = None
    part: Any = None
    delta: str | None = None
    text: str | None = None
    transcript: str | None = None
    arguments: str | None = None
    call_id: str | None = None
    name: str | None = None
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None
    error: ErrorBody | None = None
    usage: Any = None

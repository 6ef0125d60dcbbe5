"""The OpenAI request and response bodies this server takes and gives, as msgspec Structs.

Requests forbid unknown fields (a field we would silently ignore is a 400 naming it); the
sampling bounds are OpenAI's. Responses carry OpenAI's field names and nulls as the
official `openai` client types them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

MAX_TEXT = 1 << 20  # characters in one text field


class _Req(msgspec.Struct, forbid_unknown_fields=True):
    pass


class TextPart(_Req, tag_field="type", tag="text"):
    text: Annotated[str, Meta(max_length=MAX_TEXT)]


class ImageUrl(_Req):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(_Req, tag_field="type", tag="image_url"):
    image_url: ImageUrl


class InputAudio(_Req):
    data: str  # base64, or a data: URL
    format: str


class InputAudioPart(_Req, tag_field="type", tag="input_audio"):
    input_audio: InputAudio


ContentPart = TextPart | ImageUrlPart | InputAudioPart


class AudioRef(_Req):
    """An earlier spoken answer, by its `message.audio.id` (omni_mp.http.audio_ids)."""

    id: Annotated[str, Meta(max_length=128)]


class FunctionCallParam(_Req):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    arguments: Annotated[str, Meta(max_length=MAX_TEXT)]  # JSON text, as the model wrote it


class ToolCallParam(_Req):
    id: Annotated[str, Meta(min_length=1, max_length=256)]
    function: FunctionCallParam
    type: Literal["function"] = "function"


class ChatMessage(_Req):
    """One message of any role; what each role may carry is checked by omni_mp.http.conversation
    (a 400 naming `messages[i].<field>`)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str, Meta(max_length=MAX_TEXT)] | Annotated[list[ContentPart], Meta(max_length=64)] | None = None
    name: str | None = None
    audio: AudioRef | None = None  # assistant: an earlier spoken answer
    tool_calls: Annotated[list[ToolCallParam], Meta(max_length=64)] | None = None  # assistant
    tool_call_id: Annotated[str, Meta(max_length=256)] | None = None  # tool
    refusal: str | None = None  # assistant (echoed back by clients; not shown to the model)


class FunctionDef(_Req):
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None


class ToolDef(_Req):
    function: FunctionDef
    type: Literal["function"] = "function"


class NamedFunction(_Req):
    name: str


class NamedToolChoice(_Req):
    function: NamedFunction
    type: Literal["function"] = "function"


class AudioParam(_Req):
    voice: str
    format: str


class StreamOptions(_Req):
    include_usage: bool = False


Stop = Annotated[str, Meta(min_length=1, max_length=256)]


class ChatCompletionRequest(_Req):
    model: str
    messages: Annotated[list[ChatMessage], Meta(min_length=1, max_length=256)]
    modalities: Annotated[list[Literal["text", "audio"]], Meta(min_length=1, max_length=2)] | None = None
    audio: AudioParam | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None
    stop: Stop | Annotated[list[Stop], Meta(max_length=4)] | None = None
    n: int | None = None
    user: str | None = None
    tools: Annotated[list[ToolDef], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class VoiceRef(_Req):
    """OpenAI's custom-voice reference: here any voice or alias of the model, by name."""

    id: Annotated[str, Meta(min_length=1, max_length=256)]


class SpeechRequest(_Req):
    """Every field of OpenAI's speech request, then vllm-omni's Qwen3-TTS extras (`extra_body` in
    the SDK); omni_mp.http.speech says what each does here."""

    model: str
    input: Annotated[str, Meta(min_length=1, max_length=4096)]  # OpenAI's bound
    voice: Annotated[str, Meta(min_length=1, max_length=256)] | VoiceRef
    response_format: str | None = None  # mp3, OpenAI's default
    speed: float | None = None
    instructions: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None
    stream_format: str | None = None
    # vllm-omni's extras (a speech model's: Qwen3-TTS)
    task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None
    language: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    max_new_tokens: Annotated[int, Meta(ge=1)] | None = None
    ref_audio: str | None = None  # base64 or a data: URL (bounded by max_media_bytes before decoding)
    ref_text: Annotated[str, Meta(max_length=4096)] | None = None
    x_vector_only_mode: bool | None = None
    non_streaming_mode: bool | None = None  # true: the whole text in the prompt; false: a token per frame


class ImageGenerationRequest(_Req):
    """OpenAI's fields, then the diffusion extras (omni_mp's; `extra_body` in the SDK)."""

    prompt: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)]
    model: str | None = None
    n: Annotated[int, Meta(ge=1, le=10)] | None = None
    size: Annotated[str, Meta(max_length=32)] | None = None  # "WIDTHxHEIGHT" or "auto"
    response_format: str | None = None  # b64_json (the default); url is refused: nothing is stored
    output_format: str | None = None  # png only
    quality: str | None = None
    style: str | None = None
    background: str | None = None
    moderation: str | None = None
    output_compression: int | None = None
    user: str | None = None
    stream: bool | None = False
    partial_images: Annotated[int, Meta(ge=0, le=3)] | None = None  # previews streamed before the image
    # extras
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None
    num_inference_steps: Annotated[int, Meta(ge=1, le=1000)] | None = None
    true_cfg_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    negative_prompt: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None


# ---- responses ---------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int  # read from the text stage's prefix cache


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class MessageAudio(msgspec.Struct):
    id: str
    data: str  # base64, in the requested format
    expires_at: int
    transcript: str


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # JSON text


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class AssistantMessage(msgspec.Struct):
    role: str
    content: str | None
    audio: MessageAudio | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: str = "chat.completion"


class DeltaAudio(msgspec.Struct, omit_defaults=True):
    id: str
    data: str | None = None  # base64 PCM16, 24 kHz mono (as token2wav makes it)
    transcript: str | None = None
    expires_at: int | None = None  # on the first audio delta


class DeltaFunction(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunction | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    audio: DeltaAudio | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"


class ImageData(msgspec.Struct):
    b64_json: str  # a PNG file, base64
    seed: int  # omni_mp's: the noise seed of this image (the same seed and settings give it again)
    revised_prompt: None = None
    url: None = None


class ImagesResponse(msgspec.Struct):
    created: int
    data: list[ImageData]
    size: str  # WIDTHxHEIGHT
    output_format: str = "png"


class ImageStreamEvent(msgspec.Struct):
    """`image_generation.partial_image` (a preview) or `image_generation.completed`."""

    type: str
    b64_json: str
    created_at: int
    size: str
    seed: int
    partial_image_index: int | None = None
    step: int | None = None  # omni_mp's: the denoising steps done when the preview was decoded
    output_format: str = "png"
    quality: str = "auto"
    background: str = "opaque"


class Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    object: str = "model"
    voices: list[str] | None = None  # omni_mp's: what a speech request may name (GET /v1/audio/voices)


class ModelList(msgspec.Struct):
    data: list[Model]
    object: str = "list"


def to_json(obj: Any) -> bytes:
    return msgspec.json.encode(obj)

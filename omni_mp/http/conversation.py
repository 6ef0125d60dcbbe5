"""A whole conversation -> the thinker's prompt: the history builder of the chat endpoint (and
of a realtime session later).

Two steps with a small API between them:
- `from_messages(...)`: OpenAI chat messages (omni_mp.http.schemas.ChatMessage) -> a
  `Conversation` (msgspec Structs: turns of text/audio/image items, tool calls, tool
  results; the media decoded, in prompt order; an assistant `audio: {id}` resolved to its
  transcript through an AudioStore). Every refusal is a 400 naming `messages[i]...`.
- `render(conversation, policy, template, speak=...)`: the family's chat template (the
  checkpoint's own, `template` = its tokenizer's `apply_chat_template`) over the turns, with
  the family's `ChatPolicy` applied (Qwen2.5-Omni's fixed system prompt for speech), ->
  `ThinkerPrompt`: the prompt text with one placeholder per medium, the media in that order,
  and which turns the talker reads.

What the talker needs comes from the thinker's prompt itself, as in the reference (transformers'
generate()): Qwen2.5-Omni's talker reads every prompt position (system and earlier answers
included); Qwen3-Omni's reads the user turns (tool results are user turns in its template) and
the generation prompt, never the system turn or earlier answers. Each family's talker processor
finds those turns in the prompt's ids (omni_mp.models.qwen3_omni.exports.ThinkerTurns), so a
conversation needs nothing more on the wire; `ThinkerPrompt.talker_turns` says which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec

from omni_mp.config.schema import MediaLimits
from omni_mp.http.audio_ids import AudioIdError, AudioStore
from omni_mp.http.errors import bad_request
from omni_mp.http.media import MediaSizes, decode_audio, decode_image
from omni_mp.http.schemas import ChatMessage, ImageUrlPart, InputAudioPart, TextPart
from omni_mp.models.family import ChatPolicy

Role = Literal["system", "user", "assistant", "tool"]


class TextItem(msgspec.Struct, tag="text"):
    text: str


class AudioItem(msgspec.Struct, tag="audio"):
    """The conversation's next audio (Conversation.audios, in order)."""


class ImageItem(msgspec.Struct, tag="image"):
    """The conversation's next image (Conversation.images, in order)."""


Item = TextItem | AudioItem | ImageItem


class ToolCallItem(msgspec.Struct, frozen=True):
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


class Turn(msgspec.Struct):
    role: Role
    items: list[Item] = []
    tool_calls: list[ToolCallItem] = []  # assistant
    tool_call_id: str | None = None  # tool


class Conversation(msgspec.Struct):
    turns: list[Turn]
    audios: list[Any] = []  # (float32 mono samples, sample rate), in the order of the AudioItems
    images: list[Any] = []  # uint8 [height, width, 3], in the order of the ImageItems
    tools: list[dict[str, Any]] | None = None  # OpenAI tool definitions, as the template takes them


class ThinkerPrompt(msgspec.Struct):
    text: str  # the chat template's rendering, ending with the generation prompt
    audios: list[Any]
    images: list[Any]
    talker_turns: list[int]  # indices into the rendered turns that the talker reads


Template = Callable[..., str]  # apply_chat_template(messages, tools=..., add_generation_prompt=True, tokenize=False)


# ---- OpenAI messages -> Conversation -----------------------------------------------------------


def _text_of(msg: ChatMessage, param: str) -> str:
    """A system/developer/assistant/tool message's text: a string or text parts only."""
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    texts = []
    for j, part in enumerate(msg.content):
        if not isinstance(part, TextPart):
            raise bad_request(f"a {msg.role} message takes text parts only", f"{param}.content[{j}]")
        texts.append(part.text)
    return "\n".join(texts)


class _Builder:
    def __init__(self, sizes: MediaSizes, limits: MediaLimits, audio_ids: AudioStore) -> None:
        self.sizes, self.limits, self.audio_ids = sizes, limits, audio_ids
        self.conv = Conversation(turns=[])

    def user(self, msg: ChatMessage, param: str) -> Turn:
        if msg.content is None or (isinstance(msg.content, str) and not msg.content.strip()):
            raise bad_request("a user message needs content", f"{param}.content")
        if isinstance(msg.content, str):
            return Turn("user", [TextItem(msg.content)])
        items: list[Item] = []
        for j, part in enumerate(msg.content):
            where = f"{param}.content[{j}]"
            if isinstance(part, TextPart):
                items.append(TextItem(part.text))
            elif isinstance(part, InputAudioPart):
                a = part.input_audio
                self.conv.audios.append(decode_audio(a.data, a.format, self.sizes, self.limits, f"{where}.input_audio"))
                items.append(AudioItem())
            elif isinstance(part, ImageUrlPart):
                self.conv.images.append(
                    decode_image(part.image_url.url, self.sizes, self.limits, f"{where}.image_url.url")
                )
                items.append(ImageItem())
        if not items:
            raise bad_request("a user message needs content", f"{param}.content")
        return Turn("user", items)

    def assistant(self, msg: ChatMessage, param: str) -> Turn:
        text = _text_of(msg, param)
        if msg.audio is not None:
            if text.strip():
                raise bad_request("give either `content` or `audio` of an earlier answer, not both", f"{param}.content")
            try:
                text = self.audio_ids.get(msg.audio.id).transcript
            except AudioIdError as err:
                raise bad_request(str(err), f"{param}.audio.id", f"audio_id_{err.reason}") from None
        calls = [ToolCallItem(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        for k, call in enumerate(calls):
            try:
                msgspec.json.decode(call.arguments)
            except msgspec.DecodeError:
                raise bad_request(
                    "arguments must be JSON text", f"{param}.tool_calls[{k}].function.arguments"
                ) from None
        if not text and not calls:
            raise bad_request("an assistant message needs content, audio or tool_calls", f"{param}.content")
        return Turn("assistant", [TextItem(text)] if text else [], tool_calls=calls)


def _check_fields(msg: ChatMessage, param: str) -> None:
    """Fields that belong to other roles."""
    if msg.audio is not None and msg.role != "assistant":
        raise bad_request("only an assistant message carries `audio`", f"{param}.audio")
    if msg.tool_calls is not None and msg.role != "assistant":
        raise bad_request("only an assistant message carries `tool_calls`", f"{param}.tool_calls")
    if (msg.tool_call_id is None) != (msg.role != "tool"):
        raise bad_request("a tool message (and only a tool message) carries `tool_call_id`", f"{param}.tool_call_id")


def _check_order(turns: Sequence[Turn]) -> None:
    """System turns first; then a user turn; a tool turn answers a call of the assistant turn
    (or tool turns) right before it; the last turn is one the model answers (user or tool)."""
    pending: set[str] = set()
    seen_other = False
    for i, turn in enumerate(turns):
        param = f"messages[{i}].role"
        if turn.role == "system":
            if seen_other:
                raise bad_request("system/developer messages come before every other message", param, "role_order")
            continue
        if not seen_other and turn.role != "user":
            raise bad_request("the first message after the system messages is a user message", param, "role_order")
        seen_other = True
        if turn.role == "tool":
            if turn.tool_call_id not in pending:
                raise bad_request(
                    f"tool_call_id {turn.tool_call_id!r} answers no tool call of the assistant message before it",
                    f"messages[{i}].tool_call_id",
                    "role_order",
                )
            pending.discard(turn.tool_call_id)
        else:
            pending = {c.id for c in turn.tool_calls}
    if turns[-1].role not in ("user", "tool"):
        raise bad_request(
            "the last message is the one answered: a user or tool message",
            f"messages[{len(turns) - 1}].role",
            "role_order",
        )


def from_messages(
    messages: Sequence[ChatMessage], sizes: MediaSizes, limits: MediaLimits, audio_ids: AudioStore
) -> Conversation:
    """The conversation of a chat request (media decoded, audio ids resolved, roles in order)."""
    b = _Builder(sizes, limits, audio_ids)
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        _check_fields(msg, param)
        if msg.role in ("system", "developer"):
            b.conv.turns.append(Turn("system", [TextItem(_text_of(msg, param))]))
        elif msg.role == "user":
            b.conv.turns.append(b.user(msg, param))
        elif msg.role == "assistant":
            b.conv.turns.append(b.assistant(msg, param))
        else:
            b.conv.turns.append(Turn("tool", [TextItem(_text_of(msg, param))], tool_call_id=msg.tool_call_id))
        if len(b.conv.audios) > limits.max_audios or len(b.conv.images) > limits.max_images:
            raise bad_request(
                f"the conversation has more than {limits.max_audios} audios or {limits.max_images} images "
                "(its whole history goes to the model)",
                f"{param}.content",
                "too_many_media",
            )
    _check_order(b.conv.turns)
    return b.conv


# ---- Conversation -> the thinker's prompt ------------------------------------------------------


def _system_text(turns: Sequence[Turn]) -> str | None:
    texts = [it.text for t in turns if t.role == "system" for it in t.items if isinstance(it, TextItem)]
    return "\n\n".join(texts) if texts else None


def _template_message(turn: Turn) -> dict[str, Any]:
    if turn.role in ("system", "tool"):
        content: Any = "".join(it.text for it in turn.items if isinstance(it, TextItem))
    else:
        content = [
            {"type": "text", "text": it.text} if isinstance(it, TextItem)
            else {"type": "audio" if isinstance(it, AudioItem) else "image"}
            for it in turn.items
        ]  # fmt: skip
    out: dict[str, Any] = {"role": turn.role, "content": content}
    if turn.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.tool_calls
        ]
    if turn.tool_call_id is not None:
        out["tool_call_id"] = turn.tool_call_id
    return out


def render(conv: Conversation, policy: ChatPolicy, template: Template, *, speak: bool) -> ThinkerPrompt:
    """The thinker's prompt for `conv` (see the module docstring). `speak`: the answer is spoken
    (a family whose model card fixes the system prompt for speech gets it, the client's system
    text after it)."""
    system = _system_text(conv.turns)
    if speak and policy.speech_system is not None:
        system = policy.speech_system if system is None else f"{policy.speech_system}\n\n{system}"
    rest = [t for t in conv.turns if t.role != "system"]
    turns = ([Turn("system", [TextItem(system)])] if system is not None else []) + rest
    messages = [_template_message(t) for t in turns]
    text = template(messages, tools=conv.tools or None, add_generation_prompt=True, tokenize=False)
    if policy.talker_roles is None:
        talker = list(range(len(turns)))
    else:
        talker = [
            i
            for i, t in enumerate(turns)
            if t.role in policy.talker_roles or (t.role == "tool" and "user" in policy.talker_roles)
        ]
    return ThinkerPrompt(text=text, audios=list(conv.audios), images=list(conv.images), talker_turns=talker)

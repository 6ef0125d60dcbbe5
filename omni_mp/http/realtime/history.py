"""A realtime session's conversation: its items (user audio and text, assistant answers as
played, function calls and their outputs), bounded, and rendered to the thinker's prompt by the
chat endpoint's builder (omni_mp.http.conversation: `Conversation` -> `render`).

Bound: at most `max_items` items and the entry stage's `max_audios` audios. Past either, the
oldest turns go first: the oldest item is dropped, then every item up to the next user message
(so the history starts with a user turn and a function call never loses the call its output
answers). Instructions are not items: they are the session's, sent as the system turn."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np

from omni_mp.http.conversation import AudioItem, Conversation, TextItem, ToolCallItem, Turn
from omni_mp.http.conversation import Item as TurnItem


def new_id(prefix: str) -> str:
    """OpenAI-shaped ids: `item_...`, `resp_...`, `call_...` (a call id is 29 characters: LiveKit
    shortens ids over 32)."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass
class HistoryItem:
    id: str
    type: str  # message, function_call, function_call_output
    role: str | None = None  # message: user, assistant, system
    text: str = ""  # user/system text; an assistant answer's transcript (as played)
    audio: np.ndarray | None = None  # a user turn's audio, float32 at 16 kHz
    transcript: str | None = None  # its transcript (a session asking for them: omni_mp.http.realtime.transcripts)
    audio_ms: int = 0  # an assistant answer's audio sent so far
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""
    output: str = ""
    status: str = "completed"


@dataclass
class History:
    max_items: int
    max_audios: int
    items: list[HistoryItem] = field(default_factory=list)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def find(self, item_id: str) -> HistoryItem | None:
        return next((it for it in self.items if it.id == item_id), None)

    def add(self, item: HistoryItem) -> list[str]:
        """Append `item`; the ids of the items dropped to keep the bounds (module docstring)."""
        self.items.append(item)
        dropped: list[str] = []
        while (len(self.items) > self.max_items or self._audios() > self.max_audios) and self.items[0] is not item:
            dropped.append(self.items.pop(0).id)
            while self.items and not (self.items[0].type == "message" and self.items[0].role == "user"):
                if self.items[0] is item:
                    break
                dropped.append(self.items.pop(0).id)
        return dropped

    def _audios(self) -> int:
        return sum(1 for it in self.items if it.audio is not None)

    def conversation(
        self,
        instructions: str | None,
        tools: list[dict] | None,  # type: ignore[type-arg]
        start: int = 0,
    ) -> Conversation:
        """The items from `start` on as a chat conversation (omni_mp.http.conversation)."""
        items = self.items[start:]
        conv = Conversation(turns=[], tools=tools)
        system = [instructions] if instructions else []
        system += [it.text for it in items if it.type == "message" and it.role == "system"]
        if system:
            conv.turns.append(Turn("system", [TextItem("\n\n".join(system))]))
        for it in items:
            if it.type == "message" and it.role == "user":
                parts: list[TurnItem] = []
                if it.audio is not None:
                    conv.audios.append((it.audio, 16_000))
                    parts.append(AudioItem())
                if it.text:
                    parts.append(TextItem(it.text))
                conv.turns.append(Turn("user", parts))
            elif it.type == "message" and it.role == "assistant" and it.text:
                conv.turns.append(Turn("assistant", [TextItem(it.text)]))
            elif it.type == "function_call":
                call = ToolCallItem(it.call_id or it.id, it.name or "", it.arguments or "{}")
                last = conv.turns[-1] if conv.turns else None
                if last is not None and last.role == "assistant":
                    last.tool_calls.append(call)
                else:
                    conv.turns.append(Turn("assistant", [], tool_calls=[call]))
            elif it.type == "function_call_output":
                conv.turns.append(Turn("tool", [TextItem(it.output)], tool_call_id=it.call_id))
        return conv


def played_prefix(text: str, played_ms: int, total_ms: int) -> str:
    """The part of an answer's transcript heard when its audio stopped at `played_ms` of
    `total_ms`: the same fraction of its characters, cut back to a word boundary (the talker's
    timing per word is not known here; the fraction is the stated approximation)."""
    if total_ms <= 0 or played_ms >= total_ms:
        return text
    cut = int(len(text) * played_ms / total_ms)
    head = text[:cut]
    if cut < len(text) and not text[cut].isspace():
        head = head.rsplit(" ", 1)[0] if " " in head else ""
    return head.rstrip()

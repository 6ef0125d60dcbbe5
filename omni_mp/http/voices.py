"""The voices a request may name: the model's own (what its speaking stages publish) and aliases,
OpenAI's voice names among them, so that clients that send only those (pipecat's OpenAI TTS
service; LiveKit's plugin defaults to `ash`) speak in a voice of the model.

Default aliases: each of OpenAI's names maps to the first of its preferred Qwen-Omni voices
(Chelsie, Ethan, Aiden) that the model has, else to the model's first voice (sorted). The
pipeline's YAML overrides or adds any (`http: {voice_aliases: {NAME: VOICE}}`); a configured
alias whose voice the model lacks, or that names one of the model's voices, stops the server
at start with the reason. Names match case-insensitively: Qwen3-Omni's voices are lower-case.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
                 "marin", "cedar")  # fmt: skip
# Each OpenAI voice's preferred Qwen-Omni voices, in order (Chelsie a female voice, Ethan and
# Aiden male ones, by OpenAI's voice previews).
_PREFERRED = {
    "alloy": ("chelsie",), "ash": ("ethan",), "ballad": ("aiden", "ethan"), "coral": ("chelsie",),
    "echo": ("ethan",), "fable": ("aiden", "ethan"), "nova": ("chelsie",), "onyx": ("ethan",),
    "sage": ("chelsie",), "shimmer": ("chelsie",), "verse": ("aiden", "ethan"), "marin": ("chelsie",),
    "cedar": ("ethan",),
}  # fmt: skip


class VoiceInfo(msgspec.Struct):
    """One voice of GET /v1/audio/voices (OpenAI's `audio.voice` object, with its aliases)."""

    id: str
    name: str
    created_at: int
    aliases: list[str]
    object: str = "audio.voice"


class VoiceList(msgspec.Struct):
    data: list[VoiceInfo]
    object: str = "list"


class Voices:
    """The model's voices and the aliases that resolve to them."""

    def __init__(self, voices: list[str], configured: Mapping[str, str] | None = None) -> None:
        self.voices = sorted(voices)
        by_lower = {v.lower(): v for v in self.voices}
        self._by_lower = by_lower
        self.aliases: dict[str, str] = {}  # lower-cased alias -> the model's voice
        if self.voices:
            for name, preferred in _PREFERRED.items():
                self.aliases[name] = next((by_lower[p] for p in preferred if p in by_lower), self.voices[0])
        for alias, voice in (configured or {}).items():
            if alias.lower() in by_lower:
                raise ValueError(f"http.voice_aliases: {alias!r} is a voice of the model, not an alias")
            if voice.lower() not in by_lower:
                raise ValueError(f"http.voice_aliases: {alias!r} -> {voice!r}: the model's voices are {self.voices}")
            self.aliases[alias.lower()] = by_lower[voice.lower()]

    def resolve(self, name: str) -> str | None:
        """The model's voice `name` means (one of its own, or an alias); None: neither."""
        key = name.lower()
        return self._by_lower.get(key) or self.aliases.get(key)

    def names(self) -> list[str]:
        """Everything a request may name: the voices, then the aliases."""
        return [*self.voices, *sorted(a for a in self.aliases if a not in self._by_lower)]

    def listing(self, created: int) -> VoiceList:
        data = [
            VoiceInfo(id=v, name=v, created_at=created, aliases=sorted(a for a, t in self.aliases.items() if t == v))
            for v in self.voices
        ]
        return VoiceList(data=data)

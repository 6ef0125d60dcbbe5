"""What an omni family asks its thinker for a transcription (the HTTP server's
`/v1/audio/transcriptions`): the prompt its own documentation uses for speech recognition.

Both Qwen omni families document the same user turn: the audio, then
"Transcribe the <Language> audio into text." (Qwen3-Omni's README, "Setting for Evaluation",
default ASR prompt; Qwen2.5-Omni's cookbook `universal_audio_understanding`), and for Chinese
"请将这段中文语音转换为纯文本。" (the same README). Without a language the sentence drops it:
"Transcribe the audio into text.". What differs is the system turn: Qwen2.5-Omni's cookbook
sets "You are a speech recognition model." for recognition; Qwen3-Omni's README says no
system prompt should be set. (Qwen2.5-Omni's cookbook adds "without any punctuation marks",
which is for scoring word error rates: a transcription endpoint returns punctuated text.)

A caller's `prompt` (OpenAI's context for the audio) follows the instruction on a line of its
own. The languages are Qwen3-Omni's documented speech-input languages, by ISO-639-1 code
(Cantonese by ISO-639-3 `yue`, which has no ISO-639-1 code); Qwen2.5-Omni documents no list and
takes the same names.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

# The request parameter (Submit.params) that replaces an omni prompt format's default system
# turn: the thinker's prompt format reads it (omni_mp.stage.media.build_entry_input).
SYSTEM_PROMPT_PARAM = "system_prompt"

LANGUAGES: dict[str, str] = {
    "ar": "Arabic",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "id": "Indonesian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "ms": "Malay",
    "nl": "Dutch",
    "pt": "Portuguese",
    "ru": "Russian",
    "tr": "Turkish",
    "ur": "Urdu",
    "vi": "Vietnamese",
    "yue": "Cantonese",
    "zh": "Chinese",
}
CHINESE_INSTRUCTION = "请将这段中文语音转换为纯文本。"


class TranscriptionPrompt(msgspec.Struct, frozen=True):
    text: str  # the user turn's text, after the audio
    audio_token: str  # the placeholder token the processor repeats per audio frame (usage counts them)
    system: str | None = None  # the system turn instead of the format's default (None: the default)


@runtime_checkable
class Transcribes(Protocol):
    """A prompt format that knows its family's transcription prompt."""

    def transcription(self, language: str | None, context: str | None) -> TranscriptionPrompt:
        """The prompt for one audio; `language`: a key of LANGUAGES (ValueError otherwise)."""
        ...


def instruction(language: str | None, context: str | None) -> str:
    """The documented instruction for `language` (an ISO code of LANGUAGES, or None), then `context`."""
    if language is not None and language not in LANGUAGES:
        raise ValueError(f"language {language!r} is not one of {sorted(LANGUAGES)}")
    if language == "zh":
        text = CHINESE_INSTRUCTION
    elif language is None:
        text = "Transcribe the audio into text."
    else:
        text = f"Transcribe the {LANGUAGES[language]} audio into text."
    return text if not context else f"{text}\n{context}"

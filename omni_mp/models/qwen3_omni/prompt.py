"""Qwen3-Omni's prompt format (`prompt_format: qwen3_omni`): the text of one user turn with its
media placeholders, as the checkpoint's chat template renders it
(omni_mp.models.qwen3_omni.chat_template), and what its processor takes as media.

- Audio at 16 kHz (WhisperFeatureExtractor's rate). Qwen3-Omni's processor does not cut audio
  to a window (`truncation: False`; its audio encoder runs long inputs in chunks of
  `n_window`), so the only bound is the stage's `media.max_audio_s`. vLLM's processor pads an
  audio to a multiple of the feature extractor's hop (160 samples) before computing features;
  transformers' does not, so audio whose length is not such a multiple gets one more feature
  frame in vLLM than in transformers (oracle tests use whole hops).
- No system turn unless one is asked for: the template renders none by default.
- The talker reads the prompt's user turn and its assistant generation prompt
  (omni_mp.models.qwen3_omni.exports.ThinkerTurns): both come from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni_mp.models.family import ChatPolicy, whisper_frames
from omni_mp.models.qwen3_omni.chat_template import AUDIO_SLOT, IMAGE_SLOT
from omni_mp.models.transcription import TranscriptionPrompt, instruction

# Any system prompt (the model card fixes none for speech); tools in the chat template (tool
# results come back as user turns); the talker reads the user turns (tool results included) and
# the last assistant turn, never the system turn or earlier answers (transformers' generate()).
CHAT = ChatPolicy(speech_system=None, tools=True, talker_roles=("user",))


def omni_prompt_text(text: str, n_audio: int = 0, n_image: int = 0, system: str | None = None) -> str:
    """The thinker prompt for one user turn (its audios, then its images, then `text`) and the
    assistant's generation prompt; `system`: an optional system turn before it."""
    head = "" if system is None else f"<|im_start|>system\n{system}<|im_end|>\n"
    media = AUDIO_SLOT * n_audio + IMAGE_SLOT * n_image
    return f"{head}<|im_start|>user\n{media}{text}<|im_end|>\n<|im_start|>assistant\n"


N_WINDOW = 50  # the audio encoder's window in feature frames, halved (the processor's default)


class Qwen3OmniPromptFormat:
    """`prompt_format: qwen3_omni` (omni_mp.models.family.PromptFormat, CountsAudio)."""

    audio_rate = 16_000
    audio_placeholder = "<|audio_pad|>"
    reply_end = "<|im_end|>"  # the assistant turn's end, which generate() stops on
    chat = CHAT

    def max_audio_s(self, model_dir: str) -> float | None:
        return None  # no window: see the module docstring

    def render(self, text: str, n_audio: int, n_image: int, system: str | None = None) -> str:
        return omni_prompt_text(text, n_audio=n_audio, n_image=n_image, system=system)

    def audio_tokens(self, samples: int) -> int:
        """The audio encoder's output length: 13 tokens per whole chunk of 2 * N_WINDOW feature
        frames, and the rest through three stride-2 convolutions (the processor's formula)."""
        frames = whisper_frames(samples)
        chunk = 2 * N_WINDOW
        rest = (frames % chunk - 1) // 2 + 1
        return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13

    def transcription(self, language: str | None, context: str | None) -> TranscriptionPrompt:
        """The README's recognition prompt, no system turn (omni_mp.models.transcription)."""
        return TranscriptionPrompt(instruction(language, context), "<|audio_pad|>")

    def companions(self, params: Mapping[str, Any] | None) -> list[str]:
        return []  # no prompt runs beside a request's own


PROMPT_FORMAT = Qwen3OmniPromptFormat()

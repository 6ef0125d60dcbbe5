"""Qwen2.5-Omni's prompt format: its chat template, the text of one user turn with its media
placeholders, and what its processor takes as media (audio at 16 kHz, WhisperFeatureExtractor's
rate). vLLM's Qwen2.5-Omni processor expands each placeholder to the medium's tokens."""

from __future__ import annotations

SYSTEM_PROMPT = "You are a helpful assistant who can hear, see and speak."
AUDIO_SLOT = "<|audio_bos|><|AUDIO|><|audio_eos|>"
IMAGE_SLOT = "<|vision_bos|><|IMAGE|><|vision_eos|>"
VIDEO_SLOT = "<|vision_bos|><|VIDEO|><|vision_eos|>"

# Qwen2.5-Omni's chat format; for a user message of audio parts, image parts, then text, it
# renders exactly `omni_prompt_text` (the default system prompt when none is given).
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + SYSTEM_PROMPT + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' -%}{{- '" + AUDIO_SLOT + "' -}}"
    "{%- elif part['type'] == 'image' -%}{{- '" + IMAGE_SLOT + "' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '" + VIDEO_SLOT + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def omni_prompt_text(text: str, n_audio: int = 0, n_image: int = 0, system: str = SYSTEM_PROMPT) -> str:
    """The thinker prompt for one user turn: its audios, then its images, then `text`."""
    media = AUDIO_SLOT * n_audio + IMAGE_SLOT * n_image
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{media}{text}<|im_end|>\n<|im_start|>assistant\n"


class OmniPromptFormat:
    """`prompt_format: qwen2_5_omni` (omni_mp.models.family.PromptFormat)."""

    audio_rate = 16_000

    def render(self, text: str, n_audio: int, n_image: int) -> str:
        return omni_prompt_text(text, n_audio=n_audio, n_image=n_image)


PROMPT_FORMAT = OmniPromptFormat()

"""Qwen3-Omni's chat format: the special token strings of the released tokenizer and the chat
template saved with the tiny checkpoint's processor (one user turn's media parts render as
the released template renders them; vLLM's Qwen3-Omni processor expands each placeholder to the
medium's tokens)."""

from __future__ import annotations

AUDIO_SLOT = "<|audio_start|><|audio_pad|><|audio_end|>"
IMAGE_SLOT = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_SLOT = "<|vision_start|><|video_pad|><|vision_end|>"

# The released tokenizer's special tokens that the model or its processor reads.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
# Qwen3OmniMoeProcessor reads these named tokens from the tokenizer.
NAMED_TOKENS = {
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}
TTS_PAD, TTS_BOS, TTS_EOS = "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"
# Role words the talker's prompt builder finds right after <|im_start|> (single tokens).
ROLES = ("system", "user", "assistant")

# A system turn only when the messages have one; for a user message of audio parts, image
# parts, then text it renders `<|im_start|>user\n{AUDIO_SLOT...}{IMAGE_SLOT...}{text}<|im_end|>\n`.
CHAT_TEMPLATE = (
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

"""Qwen-Image's text prompt: the fixed template the text encoder reads, and the prompt format
of the text-encoder stage (`prompt_format: qwen_image`).

The template's system part (everything before the user text, 34 tokens with Qwen2.5-VL's
tokenizer) conditions the encoder but is dropped from what the DiT sees (`TEMPLATE_DROP`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni_mp.models.family import ChatPolicy
from omni_mp.models.qwen_image.params import parse_params

TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
TEMPLATE_DROP = 34  # tokens of the template before the user text
# The longest prompt the DiT takes, in tokens after the drop (diffusers' hard cap).
MAX_PROMPT_TOKENS = 1024


class QwenImagePromptFormat:
    """`prompt_format: qwen_image` (omni_mp.models.family.PromptFormat). The encoder reads text
    only: its stage's `media` limits are 0 (omni_mp/stage_configs/*qwen_image.yaml), so media are
    refused before anything is rendered; the template has no media placeholders."""

    audio_rate = 16_000  # unused: no audio reaches this format
    reply_end = None  # an encoder: it replies nothing
    chat = ChatPolicy()  # unused: the pipeline does not chat

    def max_audio_s(self, model_dir: str) -> float | None:
        return None

    def render(self, text: str, n_audio: int, n_image: int, system: str | None = None) -> str:
        if system is not None:
            raise ValueError("qwen_image's template has a fixed system part: no system prompt can replace it")
        return TEMPLATE.format(text)

    def companions(self, params: Mapping[str, Any] | None) -> list[str]:
        """The negative prompt, rendered, when the request runs true CFG (checks the params:
        a bad request fails here, before the encoder runs)."""
        p = parse_params(dict(params or {}))
        return [TEMPLATE.format(p.negative_prompt)] if p.cfg and p.negative_prompt is not None else []


PROMPT_FORMAT = QwenImagePromptFormat()

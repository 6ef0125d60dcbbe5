"""Qwen2.5-Omni's prompt format: its chat template, the text of one user turn with its media
placeholders, and what its processor takes as media (audio at 16 kHz, WhisperFeatureExtractor's
rate, at most its window: `n_samples`, 30 s by default). vLLM's Qwen2.5-Omni processor expands
each placeholder to the medium's tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_mp.models.family import ChatPolicy, whisper_frames
from omni_mp.models.transcription import TranscriptionPrompt, instruction

SYSTEM_PROMPT = "You are a helpful assistant who can hear, see and speak."
ASR_SYSTEM_PROMPT = "You are a speech recognition model."  # the cookbook's, for transcription
# Qwen2.5-Omni's model card: for audio output the system prompt must be exactly this sentence
# (otherwise "the audio output may not work as expected").
SPEECH_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)
# No tools in its chat template; its talker reads the whole prompt (transformers' generate()
# projects the thinker's embeddings + hidden states of every prompt position).
CHAT = ChatPolicy(speech_system=SPEECH_SYSTEM_PROMPT, tools=False, talker_roles=None)
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


# WhisperFeatureExtractor's window when the checkpoint does not say (its `chunk_length` default).
DEFAULT_AUDIO_WINDOW_S = 30.0


def _feature_extractor_config(model_dir: Path) -> dict[str, Any]:
    """The audio feature extractor's settings: `preprocessor_config.json` (Hugging Face's
    checkpoints) or the `feature_extractor` entry of `processor_config.json` (what
    transformers 5 writes); {} when the checkpoint has neither."""
    flat = model_dir / "preprocessor_config.json"
    if flat.is_file():
        return json.loads(flat.read_text())
    nested = model_dir / "processor_config.json"
    if nested.is_file():
        entry = json.loads(nested.read_text()).get("feature_extractor")
        return entry if isinstance(entry, dict) else {}
    return {}


class OmniPromptFormat:
    """`prompt_format: qwen2_5_omni` (omni_mp.models.family.PromptFormat, CountsAudio)."""

    audio_rate = 16_000
    audio_placeholder = "<|AUDIO|>"
    reply_end = "<|im_end|>"  # the assistant turn's end, which generate() stops on
    chat = CHAT

    def max_audio_s(self, model_dir: str) -> float | None:
        """The feature extractor's window: it pads or cuts every audio to `n_samples` samples
        at `sampling_rate` (= `chunk_length` seconds), so anything longer would be cut."""
        fe = _feature_extractor_config(Path(model_dir))
        if "n_samples" in fe:
            return float(fe["n_samples"]) / float(fe.get("sampling_rate", self.audio_rate))
        return float(fe.get("chunk_length", DEFAULT_AUDIO_WINDOW_S))

    def render(self, text: str, n_audio: int, n_image: int, system: str | None = None) -> str:
        return omni_prompt_text(text, n_audio=n_audio, n_image=n_image, system=system or SYSTEM_PROMPT)

    def audio_tokens(self, samples: int) -> int:
        """The audio encoder's output length (its conv stride 2, then pooling by 2), as the
        processor computes it from the features (transformers' Qwen2_5OmniProcessor)."""
        after_conv = (whisper_frames(samples) - 1) // 2 + 1
        return (after_conv - 2) // 2 + 1

    def transcription(self, language: str | None, context: str | None) -> TranscriptionPrompt:
        """The cookbook's recognition prompt (omni_mp.models.transcription)."""
        return TranscriptionPrompt(instruction(language, context), "<|AUDIO|>", ASR_SYSTEM_PROMPT)

    def companions(self, params: Any) -> list[str]:
        return []


PROMPT_FORMAT = OmniPromptFormat()

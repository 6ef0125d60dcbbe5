"""An entry stage's text prompt and media -> the engine's input: checked against the stage's
MediaLimits before anything is decoded, resampled or processed, then wrapped in the model's
chat format (`prompt_format`, from the model registry) with one placeholder per medium, and
the audio resampled to the rate the model's processor takes."""

from __future__ import annotations

from typing import Any

import torch

from omni_mp.config.schema import StageConfig
from omni_mp.media.audio_io import resample
from omni_mp.media.limits import MediaError, check_media_sizes, stage_media_limits
from omni_mp.models.processor import StageInput
from omni_mp.models.registry import prompt_format
from omni_mp.models.transcription import SYSTEM_PROMPT_PARAM
from omni_mp.wire.messages import MultiModalInput

__all__ = ["MediaError", "build_entry_input", "check_media"]


def check_media(stage: StageConfig, media: MultiModalInput) -> None:
    """Layouts first, then sizes against the stage's limits (audio: what its model's processor
    takes whole), then the samples' values: all before anything is resampled or processed."""
    for i, audio in enumerate(media.audios):
        s = audio.samples
        if s.dtype != torch.float32 or s.ndim != 1 or s.numel() == 0:
            raise MediaError(f"audios[{i}]: expected float32 [samples], got {s.dtype} {list(s.shape)}")
    for i, image in enumerate(media.images):
        p = image.pixels
        if p.dtype != torch.uint8 or p.ndim != 3 or p.shape[2] != 3 or p.shape[0] < 1 or p.shape[1] < 1:
            raise MediaError(f"images[{i}]: expected uint8 [height, width, 3] (RGB), got {p.dtype} {list(p.shape)}")
    audios = [(a.samples.numel(), a.sample_rate) for a in media.audios]
    images = [(im.pixels.shape[0], im.pixels.shape[1]) for im in media.images]
    check_media_sizes(stage.id, stage_media_limits(stage), audios, images)
    for i, audio in enumerate(media.audios):
        if not bool(torch.isfinite(audio.samples).all()):
            raise MediaError(f"audios[{i}]: samples must be finite")


def build_entry_input(
    stage: StageConfig,
    text: str,
    media: MultiModalInput | None,
    params: dict[str, Any] | None = None,
    *,
    formatted: bool = False,
) -> StageInput:
    """The prompt in the stage's chat format, plus vLLM `multi_modal_data` for its media, and
    the prompts the format runs beside it for this request's `params` (e.g. a negative prompt).
    `formatted`: `text` is already in the chat format (a rendered conversation) and is taken as
    it is; vLLM's processor then matches its placeholders with the media."""
    assert stage.prompt_format is not None
    fmt = prompt_format(stage.prompt_format)
    media = media or MultiModalInput()
    check_media(stage, media)
    data: dict[str, list] = {}
    if media.audios:
        # New arrays (the received tensors are views of the message buffer), at the processor's rate.
        data["audio"] = [resample(a.samples.numpy(), a.sample_rate, fmt.audio_rate) for a in media.audios]
    if media.images:
        data["image"] = [img.pixels.clone().numpy() for img in media.images]
    system = (params or {}).get(SYSTEM_PROMPT_PARAM)
    try:
        if system is not None and not isinstance(system, str):
            raise ValueError(f"params[{SYSTEM_PROMPT_PARAM!r}] must be a string, got {type(system).__name__}")
        prompt = (
            text if formatted else fmt.render(text, n_audio=len(media.audios), n_image=len(media.images), system=system)
        )
        companions = [StageInput(prompt_text=c) for c in fmt.companions(params)]
    except ValueError as err:
        raise MediaError(str(err)) from None
    return StageInput(prompt_text=prompt, multi_modal=data or None, companions=companions, params=params)

"""What an entry stage accepts as media per request, and the checks on sizes alone (counts,
seconds, pixels): the coordinator runs them before forwarding a request, the stage again
before it decodes, resamples or processes anything.

The audio limit is the model's: a stage's `media.max_audio_s` defaults to the longest audio its
checkpoint's processor takes whole (its prompt format says how to read it), and may not exceed
it: longer audio would be cut by the processor without a word.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import msgspec

from omni_mp.config.schema import MediaLimits, PipelineConfig, StageConfig

# A prompt format whose checkpoint declares no audio limit: what an entry stage takes then.
FALLBACK_MAX_AUDIO_S = 300.0


class MediaError(ValueError):
    """A request's media do not fit the stage (the message says which and why)."""


@functools.cache
def checkpoint_max_audio_s(prompt_format: str, model: str) -> float | None:
    """The longest audio the checkpoint of `model` (a dir or a built-in name) takes whole,
    per its prompt format; None: it declares no limit."""
    from omni_mp.models.registry import prompt_format as format_of
    from omni_mp.models.registry import resolve_model

    return format_of(prompt_format).max_audio_s(resolve_model(model))


def stage_media_limits(stage: StageConfig) -> MediaLimits:
    """The stage's limits with `max_audio_s` resolved from its checkpoint; ValueError if the
    config allows longer audio than the checkpoint's processor takes."""
    limits = stage.media
    if stage.prompt_format is None:
        return limits
    model_s = checkpoint_max_audio_s(stage.prompt_format, stage.model)
    if limits.max_audio_s is None:
        return msgspec.structs.replace(limits, max_audio_s=FALLBACK_MAX_AUDIO_S if model_s is None else model_s)
    if model_s is not None and limits.max_audio_s > model_s:
        raise ValueError(
            f"`stages[{stage.id}].media.max_audio_s`: {limits.max_audio_s:g} s, but the model's processor "
            f"takes at most {model_s:g} s of audio (it would cut the rest); set at most {model_s:g}"
        )
    return limits


def resolve_media_limits(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` with every entry stage's media limits resolved (see stage_media_limits): done once
    by the coordinator, so the stages get them in their config."""
    stages = [msgspec.structs.replace(s, media=stage_media_limits(s)) if not s.inputs else s for s in cfg.stages]
    return msgspec.structs.replace(cfg, stages=stages)


def check_media_sizes(
    stage_id: int, limits: MediaLimits, audios: Sequence[tuple[int, int]], images: Sequence[tuple[int, int]]
) -> None:
    """MediaError unless the media fit `limits` (resolved): `audios` as (samples, sample rate),
    `images` as (height, width)."""
    if len(audios) > limits.max_audios:
        raise MediaError(f"{len(audios)} audios: stage {stage_id} takes at most {limits.max_audios}")
    if len(images) > limits.max_images:
        raise MediaError(f"{len(images)} images: stage {stage_id} takes at most {limits.max_images}")
    max_s = limits.max_audio_s if limits.max_audio_s is not None else FALLBACK_MAX_AUDIO_S
    for i, (n, rate) in enumerate(audios):
        if n / rate > max_s:
            raise MediaError(
                f"audios[{i}]: {n / rate:.2f} s of audio; stage {stage_id} takes at most {max_s:g} s "
                f"(max_audio_s, by default the longest audio its model's processor takes whole)"
            )
    for i, (h, w) in enumerate(images):
        if h * w > limits.max_image_pixels:
            raise MediaError(f"images[{i}]: {h}x{w} pixels > max_image_pixels={limits.max_image_pixels}")

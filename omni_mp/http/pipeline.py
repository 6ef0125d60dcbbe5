"""What the HTTP server needs to know of the pipeline it fronts, read from its YAML once:
which final stage answers in text and which in audio, the voices, the media limits, and how
an OpenAI request's sampling maps onto the stages' own sampling."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from omni_mp.config import MediaLimits, PipelineConfig, StageConfig
from omni_mp.wire.payload import SamplingParamsMsg


def stage_name(stage: StageConfig) -> str:
    """A short label for metrics: its kind, and the checkpoint part it runs if any."""
    return stage.kind if stage.model_part is None else f"{stage.kind}/{stage.model_part}"


def _speaks(stage: StageConfig) -> bool:
    return stage.kind == "diffusion" or stage.model_part == "talker"


def load_voices(cfg: PipelineConfig) -> list[str]:
    """The voices every speaking stage knows (their checkpoints' speaker tables)."""
    from omni_mp.models.checkpoint import load_speakers
    from omni_mp.models.tiny import resolve_model

    common: set[str] | None = None
    for stage in cfg.stages:
        if _speaks(stage) and (Path(resolve_model(stage.model)) / "spk_dict.pt").exists():
            names = set(load_speakers(resolve_model(stage.model)))
            common = names if common is None else common & names
    return sorted(common or ())


@dataclass(frozen=True)
class Sampling:
    """The OpenAI sampling fields of one request (None: the stage's own setting)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class PipelineView:
    cfg: PipelineConfig
    text_stage: StageConfig
    audio_stage: StageConfig | None
    voices: list[str]
    default_voice: str | None

    @classmethod
    def of(cls, cfg: PipelineConfig, voices: list[str]) -> PipelineView:
        finals = cfg.final_stages
        text = [s for s in finals if s.kind == "ar" and s.model_part is None]
        if not text:
            raise ValueError(f"pipeline {cfg.name!r}: no final AR stage answers in text")
        audio = next((s for s in finals if s.kind == "diffusion"), None)
        default = audio.diffusion.default_speaker if audio is not None else None
        if default is None and voices:
            default = voices[0]
        return cls(cfg, text[0], audio, voices, default)

    @property
    def media_limits(self) -> MediaLimits:
        return self.text_stage.media if not self.text_stage.inputs else MediaLimits()

    def sampling(self, s: Sampling, *, audio: bool) -> dict[int, SamplingParamsMsg]:
        """Per-stage overrides: the text stage gets the OpenAI fields; the seed also seeds
        the audio stage's noise, so the same seed gives the same answer and voice."""
        out: dict[int, SamplingParamsMsg] = {}
        changes = {k: v for k, v in vars(s).items() if v is not None}
        if changes:
            out[self.text_stage.id] = msgspec.structs.replace(self.text_stage.sampling, **changes)
        if audio and self.audio_stage is not None and s.seed is not None:
            out[self.audio_stage.id] = msgspec.structs.replace(self.audio_stage.sampling, seed=s.seed)
        return out

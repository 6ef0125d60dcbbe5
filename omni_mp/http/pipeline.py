"""What the HTTP server needs to know of the pipeline it fronts, read from its YAML (and the
voices from the stages once they serve): which final stage answers in text and which in
audio, the media limits, and how an OpenAI request's sampling maps onto the stages' own."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import msgspec

from omni_mp.config.schema import MediaLimits, PipelineConfig, StageConfig
from omni_mp.models.family import ChatPolicy
from omni_mp.models.registry import makes_images
from omni_mp.wire.messages import SamplingParamsMsg, StatusReply


def stage_name(stage: StageConfig) -> str:
    """A short label for metrics: its kind, and the checkpoint part it runs if any."""
    return stage.kind if stage.model_part is None else f"{stage.kind}/{stage.model_part}"


def voices_of(status: StatusReply) -> list[str]:
    """The voices every speaking stage knows: each publishes its own in its Ready info."""
    common: set[str] | None = None
    for st in status.stages:
        if st.info.get("speakers"):
            names = set(st.info["speakers"].split(","))
            common = names if common is None else common & names
    return sorted(common or ())


@dataclass(frozen=True)
class Sampling:
    """The OpenAI sampling fields of one request (None: the stage's own setting)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


@dataclass
class PipelineView:
    cfg: PipelineConfig
    text_stage: StageConfig | None  # None: no chat (an image pipeline)
    audio_stage: StageConfig | None
    image_stage: StageConfig | None = None
    voices: list[str] = field(default_factory=list)  # from the stages once they serve (voices_of)
    # A text-to-speech model (Qwen3-TTS): its entry stage speaks the request's text as given
    # (its prompt format builds the input), so /v1/audio/speech only; no chat.
    speech_only: bool = False

    @classmethod
    def of(cls, cfg: PipelineConfig) -> PipelineView:
        from omni_mp.models.registry import prompt_format

        finals = cfg.final_stages
        entries = [s for s in cfg.entry_stages if s.prompt_format is not None]
        if entries and all(getattr(prompt_format(s.prompt_format), "embeds_prompt", False) for s in entries):  # type: ignore[arg-type]
            audio_only = [s for s in finals if s.kind == "diffusion" and not makes_images(s.diffusion.model_type)]
            if not audio_only:
                raise ValueError(f"pipeline {cfg.name!r}: a speech model with no final audio stage")
            return cls(cfg, None, audio_only[0], speech_only=True)
        # The text answer: a final AR stage that takes the client's prompt (an omni thinker,
        # whatever checkpoint part it runs), else a final AR stage of a whole checkpoint.
        text = [s for s in finals if s.kind == "ar" and not s.inputs]
        text = text or [s for s in finals if s.kind == "ar" and s.model_part is None]
        diffusion = [s for s in finals if s.kind == "diffusion"]
        images = [s for s in diffusion if makes_images(s.diffusion.model_type)]
        audio = [s for s in diffusion if s not in images]
        if not text and not images:
            raise ValueError(f"pipeline {cfg.name!r}: no final stage answers in text or makes images")
        return cls(cfg, text[0] if text else None, audio[0] if audio else None, images[0] if images else None)

    @functools.cached_property  # reads the checkpoints once
    def media_limits(self) -> MediaLimits:
        """What the entry stages take (each limit the smallest of theirs, `max_audio_s` resolved
        from their checkpoints as the coordinator does), checked before decoding."""
        from omni_mp.media.limits import stage_media_limits

        entries = [stage_media_limits(s) for s in self.cfg.entry_stages] or [MediaLimits()]
        return MediaLimits(**{f: min(getattr(m, f) for m in entries) for f in MediaLimits.__struct_fields__})

    @functools.cached_property
    def speech_task(self) -> str | None:
        """A speech model's variant (`task_type`: CustomVoice, VoiceDesign, Base), from its entry
        stage's prompt format and checkpoint; None for other pipelines."""
        from omni_mp.models.registry import prompt_format, resolve_model

        if not self.speech_only:
            return None
        stage = self.cfg.entry_stages[0]
        fmt = prompt_format(stage.prompt_format)  # type: ignore[arg-type]
        task = getattr(fmt, "task_type", None)
        return None if task is None else str(task(str(resolve_model(stage.model))))

    @functools.cached_property
    def chat_policy(self) -> ChatPolicy:
        """The entry stage's chat format's policy for whole conversations (a default one for a
        stage without a chat format)."""
        from omni_mp.models.registry import prompt_format

        names = [s.prompt_format for s in self.cfg.entry_stages if s.prompt_format is not None]
        return prompt_format(names[0]).chat if names else ChatPolicy()

    @property
    def has_chat_format(self) -> bool:
        """The entry stages wrap the prompt in a model's chat format (`prompt_format`); without
        one, the prompt is taken as plain text."""
        return bool(self.cfg.entry_stages) and all(s.prompt_format is not None for s in self.cfg.entry_stages)

    @property
    def max_model_len(self) -> int | None:
        """The entry stage's context (its `max_model_len` engine arg), None when unset."""
        for s in self.cfg.entry_stages:
            if s.engine_args.get("max_model_len") is not None:
                return int(s.engine_args["max_model_len"])
        return None

    def sampling(self, s: Sampling, *, audio: bool) -> dict[int, SamplingParamsMsg]:
        """Per-stage overrides: the text stage gets the OpenAI fields; the seed also seeds
        the audio stage's noise, so the same seed gives the same answer and voice."""
        out: dict[int, SamplingParamsMsg] = {}
        assert self.text_stage is not None
        changes = {k: v for k, v in vars(s).items() if v is not None}
        if changes:
            out[self.text_stage.id] = msgspec.structs.replace(self.text_stage.sampling, **changes)
        if audio and self.audio_stage is not None and s.seed is not None:
            out[self.audio_stage.id] = msgspec.structs.replace(self.audio_stage.sampling, seed=s.seed)
        return out

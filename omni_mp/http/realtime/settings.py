"""A realtime session's settings: `session.update` (GA or beta shape) applied to them, and the
session object sent back in `session.created` / `session.updated` in the session's dialect."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from omni_mp.http.realtime.events import (
    AudioFormat,
    Format,
    RealtimeError,
    SessionConfig,
    Tool,
    Transcription,
    TurnDetection,
)
from omni_mp.http.realtime.vad import VadSettings
from omni_mp.http.realtime.wire_audio import FORMATS, PCM16, WireFormat
from omni_mp.http.voices import Voices
from omni_mp.models.transcription import LANGUAGES


@dataclass
class Turns:
    """server_vad (VAD on) or none (manual turns: commit and response.create)."""

    vad: VadSettings | None = field(default_factory=VadSettings)
    create_response: bool = True
    interrupt_response: bool = True


@dataclass
class Settings:
    voice: str | None
    audio_out: bool
    instructions: str | None = None
    turns: Turns = field(default_factory=Turns)
    tools: list[dict[str, Any]] | None = None  # in chat completions' shape
    tool_choice: Any = "auto"
    max_tokens: int | None = None
    temperature: float | None = None
    in_format: WireFormat = PCM16
    out_format: WireFormat = PCM16
    transcription: Transcription | None = None  # None: the user's audio turns get no transcript


def format_of(fmt: Format | None, param: str) -> WireFormat | None:
    """The wire format named (None: not named): beta's string or GA's {type, rate}."""
    if fmt is None:
        return None
    for known in FORMATS:
        if fmt == known.beta:
            return known
        if isinstance(fmt, AudioFormat) and fmt.type == known.ga and fmt.rate in (None, known.rate):
            return known
    got = fmt if isinstance(fmt, str) else msgspec.to_builtins(fmt)
    names = ", ".join(f"{f.ga} ({f.beta}, {f.rate} Hz)" for f in FORMATS)
    raise RealtimeError(f"audio format {got!r} is not supported: {names}", "unsupported_value", param)


def transcription_of(t: Transcription | None, param: str) -> Transcription | None:
    if t is not None and t.language is not None and t.language not in LANGUAGES:
        raise RealtimeError(f"language {t.language!r} is not supported; supported: {sorted(LANGUAGES)}",
                            "invalid_value", f"{param}.language")  # fmt: skip
    return t


def max_tokens_of(value: int | str | None, param: str) -> int | None:
    if value is None or value == "inf":
        return None
    if isinstance(value, int) and value >= 1:
        return value
    raise RealtimeError(f'{value!r}: an integer >= 1 or "inf"', "invalid_value", param)


def _turns(td: TurnDetection | None, default_barge_in: bool, param: str) -> Turns:
    if td is None:
        return Turns(vad=None)
    if td.type not in ("server_vad", "semantic_vad"):
        raise RealtimeError(
            f"turn_detection type {td.type!r}: server_vad, semantic_vad or null", "invalid_value", f"{param}.type"
        )
    d = VadSettings()
    threshold = d.threshold if td.threshold is None else td.threshold
    if not 0.0 <= threshold <= 1.0:
        raise RealtimeError("threshold is between 0 and 1", "invalid_value", f"{param}.threshold")
    for name in ("prefix_padding_ms", "silence_duration_ms"):
        v = getattr(td, name)
        if v is not None and not 0 <= v <= 10_000:
            raise RealtimeError(f"{name} is between 0 and 10000", "invalid_value", f"{param}.{name}")
    vad = VadSettings(
        threshold,
        d.prefix_padding_ms if td.prefix_padding_ms is None else td.prefix_padding_ms,
        d.silence_duration_ms if td.silence_duration_ms is None else td.silence_duration_ms,
    )
    interrupt = default_barge_in if td.interrupt_response is None else td.interrupt_response
    return Turns(vad, td.create_response is not False, interrupt)


def tools_of(tools: list[Tool], param: str) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(tools):
        if t.type != "function":
            raise RealtimeError(f"tool type {t.type!r}: only function tools", "unsupported_value", f"{param}[{i}].type")
        fn: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            fn["description"] = t.description
        fn["parameters"] = t.parameters or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def modalities_of(mods: list[str], can_speak: bool, param: str) -> bool:
    """Whether the answer is spoken: GA's ["audio"] / ["text"], beta's ["text", "audio"] / ["text"]."""
    if not mods or any(m not in ("text", "audio") for m in mods):
        raise RealtimeError(f"{mods!r}: ['audio'] or ['text']", "invalid_value", param)
    if "audio" in mods and not can_speak:
        raise RealtimeError("this pipeline cannot speak: ['text'] only", "unsupported_value", param)
    return "audio" in mods


def resolve_voice(voices: Voices, name: str, param: str) -> str:
    got = voices.resolve(name)
    if got is None:
        raise RealtimeError(f"unknown voice {name!r}; this model's are {voices.names()}", "invalid_value", param)
    return got


def apply_update(s: Settings, cfg: SessionConfig, voices: Voices, can_speak: bool, barge_in: bool) -> None:
    """`cfg` onto `s`, all or nothing (every field is checked before any is applied)."""
    new = Settings(**vars(s))
    p = "session"
    if cfg.instructions is not None:
        new.instructions = cfg.instructions
    mods = cfg.output_modalities if cfg.output_modalities is not None else cfg.modalities
    if mods is not None:
        new.audio_out = modalities_of(mods, can_speak, f"{p}.output_modalities")
    _audio_update(new, cfg, voices, barge_in, p)
    if cfg.voice is not None:
        new.voice = resolve_voice(voices, cfg.voice, f"{p}.voice")
    if cfg.tools is not None:
        new.tools = tools_of(cfg.tools, f"{p}.tools") or None
    if cfg.tool_choice is not None:
        new.tool_choice = cfg.tool_choice
    limit = cfg.max_output_tokens if cfg.max_output_tokens is not None else cfg.max_response_output_tokens
    if limit is not None:
        new.max_tokens = max_tokens_of(limit, f"{p}.max_output_tokens")
    if cfg.temperature is not None:
        new.temperature = cfg.temperature
    vars(s).update(vars(new))


def _audio_update(new: Settings, cfg: SessionConfig, voices: Voices, barge_in: bool, p: str) -> None:
    """Formats, turn detection, transcription and voice, GA's nested fields and beta's flat ones."""
    a_in = cfg.audio.input if cfg.audio is not None else None
    a_out = cfg.audio.output if cfg.audio is not None else None
    new.in_format = format_of(cfg.input_audio_format, f"{p}.input_audio_format") or new.in_format
    new.out_format = format_of(cfg.output_audio_format, f"{p}.output_audio_format") or new.out_format
    if cfg.input_audio_transcription is not msgspec.UNSET:
        new.transcription = transcription_of(cfg.input_audio_transcription, f"{p}.input_audio_transcription")
    if a_in is not None:
        new.in_format = format_of(a_in.format, f"{p}.audio.input.format") or new.in_format
        if a_in.turn_detection is not msgspec.UNSET:
            new.turns = _turns(a_in.turn_detection, barge_in, f"{p}.audio.input.turn_detection")
        if a_in.transcription is not msgspec.UNSET:
            new.transcription = transcription_of(a_in.transcription, f"{p}.audio.input.transcription")
    if cfg.turn_detection is not msgspec.UNSET:
        new.turns = _turns(cfg.turn_detection, barge_in, f"{p}.turn_detection")
    if a_out is not None:
        new.out_format = format_of(a_out.format, f"{p}.audio.output.format") or new.out_format
        if a_out.voice is not None:
            new.voice = resolve_voice(voices, a_out.voice, f"{p}.audio.output.voice")


def _transcription_json(t: Transcription | None) -> dict[str, Any] | None:
    return None if t is None else {"model": t.model, "language": t.language, "prompt": t.prompt}


def _turn_json(t: Turns) -> dict[str, Any] | None:
    if t.vad is None:
        return None
    v = t.vad
    return {"type": "server_vad", "threshold": v.threshold, "prefix_padding_ms": v.prefix_padding_ms,
            "silence_duration_ms": v.silence_duration_ms, "create_response": t.create_response,
            "interrupt_response": t.interrupt_response}  # fmt: skip


def session_json(s: Settings, session_id: str, model: str, beta: bool) -> dict[str, Any]:
    tools = [{"type": "function", **t["function"]} for t in s.tools or []]
    limit: int | str = "inf" if s.max_tokens is None else s.max_tokens
    if beta:
        return {"object": "realtime.session", "id": session_id, "model": model,
                "modalities": ["text", "audio"] if s.audio_out else ["text"], "instructions": s.instructions or "",
                "voice": s.voice, "input_audio_format": s.in_format.beta, "output_audio_format": s.out_format.beta,
                "turn_detection": _turn_json(s.turns), "tools": tools, "tool_choice": s.tool_choice,
                "max_response_output_tokens": limit,
                "input_audio_transcription": _transcription_json(s.transcription)}  # fmt: skip
    return {"type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "output_modalities": ["audio"] if s.audio_out else ["text"], "instructions": s.instructions or "",
            "audio": {"input": {"format": s.in_format.describe(False), "turn_detection": _turn_json(s.turns),
                                "transcription": _transcription_json(s.transcription)},
                      "output": {"format": s.out_format.describe(False), "voice": s.voice}},
            "tools": tools, "tool_choice": s.tool_choice, "max_output_tokens": limit}  # fmt: skip

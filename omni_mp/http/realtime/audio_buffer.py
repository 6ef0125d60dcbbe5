"""The input audio buffer: base64 audio in the session's input format (PCM16 at 24 kHz or G.711
at 8 kHz; its length checked before decoding) -> float32 at 16 kHz (soxr, streamed: what the
VAD and Qwen's audio encoders take), bounded per turn, with the session's audio clock
(milliseconds of audio the client sent)."""

from __future__ import annotations

import base64
import binascii

import numpy as np
import soxr

from omni_mp.http.realtime.events import RealtimeError
from omni_mp.http.realtime.vad import RATE
from omni_mp.http.realtime.wire_audio import PCM16, WireFormat, decode


def samples_of(data: str, fmt: WireFormat, max_b64: int, param: str) -> np.ndarray:
    """int16 samples (at `fmt.rate`) of a base64 payload, refused by its length before decoding."""
    if len(data) > max_b64:
        raise RealtimeError(f"{len(data)} base64 characters in one append > the limit of {max_b64}",
                            "input_audio_buffer_append_too_large", param)  # fmt: skip
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("audio is not valid base64", "invalid_value", param) from None
    if fmt is PCM16 and len(raw) % 2:
        raise RealtimeError(f"{len(raw)} bytes: PCM16 audio has an even number of bytes", "invalid_value", param)
    return decode(fmt, raw)


def to_model_rate(pcm: np.ndarray, rate: int) -> np.ndarray:
    """A whole piece of int16 audio at `rate` (an item's audio) as float32 at 16 kHz."""
    return soxr.resample(pcm.astype(np.float32) / 32768.0, rate, RATE).astype(np.float32)


class InputBuffer:
    """One format's buffer (a session that changes its input format gets a new one)."""

    def __init__(self, max_s: float, rate: int = PCM16.rate) -> None:
        self.max_samples = int(max_s * RATE)
        self.rate = rate
        self._stream = soxr.ResampleStream(rate, RATE, 1, dtype="float32")
        self._parts: list[np.ndarray] = []
        self.samples = 0  # buffered, at 16 kHz
        self.received_ms = 0.0  # the session's audio clock

    def append(self, pcm: np.ndarray) -> np.ndarray:
        """Buffer `pcm` (int16 at the buffer's rate); its 16 kHz float32 samples (for the VAD)."""
        incoming = len(pcm) * RATE // self.rate
        if self.samples + incoming > self.max_samples:
            raise RealtimeError(f"the turn's audio would pass max_turn_audio_s={self.max_samples / RATE:g}: "
                                "commit or clear the buffer", "input_audio_buffer_full")  # fmt: skip
        self.received_ms += len(pcm) * 1000 / self.rate
        out = self._stream.resample_chunk(pcm.astype(np.float32) / 32768.0).astype(np.float32, copy=False)
        if len(out):
            self._parts.append(out)
            self.samples += len(out)
        return out

    def keep_last(self, ms: int) -> None:
        """Drop all but the last `ms` of buffered audio (VAD mode between turns: the prefix padding)."""
        keep = ms * RATE // 1000
        if self.samples <= keep:
            return
        audio = np.concatenate(self._parts)[self.samples - keep :] if keep else np.zeros(0, np.float32)
        self._parts, self.samples = ([audio] if keep else []), keep

    def take(self) -> np.ndarray:
        """The turn's audio, the resampler flushed (so a turn's samples equal a one-shot
        resampling of what the client sent) and started anew for the next turn."""
        tail = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream = soxr.ResampleStream(self.rate, RATE, 1, dtype="float32")
        parts = [*self._parts, tail.astype(np.float32, copy=False)]
        self._parts, self.samples = [], 0
        return np.concatenate(parts)

    def clear(self) -> None:
        self._parts, self.samples = [], 0

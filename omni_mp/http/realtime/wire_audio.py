"""The audio formats of a realtime session, as OpenAI names them: PCM16 at 24 kHz (GA
`audio/pcm`, beta `pcm16`), and G.711 at 8 kHz, mu-law (GA `audio/pcmu`, beta `g711_ulaw`) or
A-law (GA `audio/pcma`, beta `g711_alaw`), one byte a sample. G.711 is coded by FFmpeg's
`pcm_mulaw` / `pcm_alaw` through PyAV (stateless per sample: a codec context per call)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import av
import numpy as np


@dataclass(frozen=True)
class WireFormat:
    ga: str  # GA's `type`
    beta: str  # beta's string
    rate: int
    codec: str | None  # FFmpeg's G.711 codec; None: raw PCM16 little-endian

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.codec is None else 1

    def describe(self, beta: bool) -> Any:
        """The session object's spelling of this format."""
        if beta:
            return self.beta
        return {"type": self.ga, "rate": self.rate} if self.codec is None else {"type": self.ga}


PCM16 = WireFormat("audio/pcm", "pcm16", 24_000, None)
PCMU = WireFormat("audio/pcmu", "g711_ulaw", 8_000, "pcm_mulaw")
PCMA = WireFormat("audio/pcma", "g711_alaw", 8_000, "pcm_alaw")
FORMATS = (PCM16, PCMU, PCMA)


def decode(fmt: WireFormat, raw: bytes) -> np.ndarray:
    """int16 samples at `fmt.rate` of the bytes a client sent."""
    if fmt.codec is None:
        return np.frombuffer(raw, dtype="<i2")
    if not raw:
        return np.zeros(0, np.int16)
    ctx: Any = av.CodecContext.create(fmt.codec, "r")
    ctx.sample_rate, ctx.layout = fmt.rate, "mono"
    frames = ctx.decode(av.Packet(raw))
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16, copy=False)


def encode(fmt: WireFormat, pcm: np.ndarray) -> bytes:
    """The bytes to send of int16 samples at `fmt.rate`."""
    if fmt.codec is None:
        return pcm.astype("<i2", copy=False).tobytes()
    if not len(pcm):
        return b""
    ctx: Any = av.CodecContext.create(fmt.codec, "w")
    ctx.sample_rate, ctx.format, ctx.layout = fmt.rate, "s16", "mono"
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16",
                                       layout="mono")  # fmt: skip
    frame.sample_rate = fmt.rate
    return b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])

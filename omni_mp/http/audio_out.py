"""Audio answers: float32 samples -> 16-bit PCM (little-endian), base64, and WAV.

A WAV that is streamed has no known length: its header carries 0xFFFFFFFF as the RIFF and
data sizes, the placeholder of streaming writers that libsndfile and browsers read to the
end of the data."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import soundfile

SAMPLE_RATE = 24_000  # what the OpenAI API documents for pcm16 (and token2wav's rate)
_UNKNOWN = b"\xff\xff\xff\xff"


def pcm16(samples: Any) -> bytes:
    """Mono float samples in [-1, 1] (clipped) as int16 little-endian bytes, scaled by 32767."""
    x = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return np.rint(x * 32767.0).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """A complete mono 16-bit WAV file holding `pcm`."""
    buf = io.BytesIO()
    soundfile.write(buf, np.frombuffer(pcm, dtype="<i2"), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def streaming_wav_header(sample_rate: int) -> bytes:
    """The header of a mono 16-bit WAV whose length is not known yet."""
    head = bytearray(wav_bytes(b"", sample_rate))
    assert head[36:40] == b"data" and len(head) == 44, "libsndfile wrote an unexpected WAV header"
    head[4:8] = _UNKNOWN
    head[40:44] = _UNKNOWN
    return bytes(head)

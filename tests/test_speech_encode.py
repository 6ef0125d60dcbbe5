"""The speech encoders (omni_mp.http.audio_encode) on signals whose content is known: every
format decodes with PyAV (FFmpeg) to 24 kHz mono holding the samples put in (lossless: exactly;
lossy: aligned past the codec's priming, correlation >= LOSSY_CORR), streams its bytes as the
chunks come, and `speed` changes the duration by 1/speed (within 1 % and 25 ms) but not the
pitch (within 1 %)."""

from __future__ import annotations

import numpy as np
import pytest

from omni_mp.http.audio_encode import FORMATS, SpeechEncoder, atempo_chain
from tests.speech_checks import Decoded, opus_input_rate, pcm_samples

RATE = 24_000
N = 2 * RATE
CHUNK = 4_800  # 0.2 s: the pieces a stage streams
LOSSY_CORR = 0.99  # a harmonic signal survives every lossy codec at its bit rate this well
PRIMING = {"mp3": 1105, "aac": 1024}  # samples the encoder puts before the signal (no gapless tag: not seekable)


def _voiced(n: int = N) -> np.ndarray:
    """A vowel-like int16 signal: three harmonics of 180 Hz under a slow envelope."""
    t = np.arange(n) / RATE
    x = sum(np.sin(2 * np.pi * 180 * k * t) / k for k in (1, 2, 3)) * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))
    return np.round(x * 8000).astype("<i2")


def _encode(fmt: str, pcm: np.ndarray, speed: float = 1.0) -> list[bytes]:
    enc = SpeechEncoder(fmt, speed)
    parts = [enc.encode(pcm[i : i + CHUNK].tobytes()) for i in range(0, pcm.size, CHUNK)]
    return [*parts, enc.finish()]


def _samples(fmt: str, data: bytes) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return pcm_samples(data), RATE
    d = Decoded(data)
    assert d.channels == 1
    return d.samples, d.rate


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_to_the_samples_and_streams(fmt: str) -> None:
    pcm = _voiced()
    parts = _encode(fmt, pcm)
    data = b"".join(parts)
    got, rate = _samples(fmt, data)
    want = pcm.astype(np.float32) / 32768
    if fmt == "opus":  # Opus decodes at 48 kHz, the one rate of its decoders; the header keeps ours
        assert rate == 48_000 and opus_input_rate(data) == RATE and got.size == 2 * N
        got = got[::2]  # (the signal is far below 12 kHz: every other sample is the 24 kHz signal)
    else:
        assert rate == RATE
    if fmt in ("pcm", "wav", "flac"):
        assert got.size == N and np.array_equal(got, want)
    else:
        lag = PRIMING.get(fmt, 0)
        assert N <= got.size - lag <= N + 2304, got.size  # padded to whole codec frames
        seg = got[lag : lag + N]
        corr = float(np.dot(seg, want) / np.linalg.norm(seg) / np.linalg.norm(want))
        assert corr >= LOSSY_CORR, f"{fmt}: correlation {corr:.4f}"
    # Streamed: most bytes went out with the chunks, not at the end.
    assert sum(len(p) for p in parts[:-1]) >= len(data) / 2, [len(p) for p in parts]


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.25, 2.0, 4.0])
def test_speed_changes_the_duration_not_the_pitch(speed: float) -> None:
    tone = np.round(np.sin(2 * np.pi * 440 * np.arange(N) / RATE) * 10_000).astype("<i2")
    got = pcm_samples(b"".join(_encode("pcm", tone, speed)))
    # atempo's windows (tens of ms) leave a few ms to a window's length more or less at the ends.
    assert abs(got.size - N / speed) <= 0.01 * N / speed + 0.025 * RATE, (got.size, N / speed)
    spectrum = np.abs(np.fft.rfft(got * np.hanning(got.size)))
    peak = float(np.argmax(spectrum) * RATE / got.size)
    assert abs(peak - 440) <= 4.4, peak  # within 1 %: the tempo changed, the pitch did not


def test_atempo_chain_covers_openais_range() -> None:
    for speed in (0.25, 0.3, 0.5, 1.0, 2.0, 3.0, 4.0):
        chain = atempo_chain(speed)
        assert all(0.5 <= f <= 2.0 for f in chain) and abs(float(np.prod(chain)) - speed) < 1e-9

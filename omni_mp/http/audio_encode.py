"""Speech audio as it is made: 16-bit PCM chunks -> bytes of a response format, chunk by chunk,
and the tempo changed by FFmpeg's `atempo` filter (PyAV) when a request asks for a speed.

Formats (24 kHz mono throughout; OpenAI's `response_format`):
- `pcm`: the raw samples (int16 little-endian); `wav`: a WAV header of unknown length
  (audio_out.streaming_wav_header), then the samples.
- `mp3` (LAME), `opus` (libopus in Ogg), `aac` (FFmpeg's AAC-LC in ADTS), `flac`: FFmpeg's
  encoders and muxers through PyAV, writing to a sink that cannot seek, so every muxer streams:
  what it has written goes out after each chunk. Lossy encoders add their priming and pad
  their last frame (mp3 and aac decode slightly longer than the samples put in; Ogg Opus
  records both and decodes exactly, at 48 kHz, the rate every Opus decoder plays; its header
  keeps 24 kHz as the input rate). A FLAC stream says its length is unknown (no seeking back).

Bounded: the encoder holds at most one codec frame and the muxer's page; `atempo` a window of
tens of milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np

from omni_mp.http.audio_out import SAMPLE_RATE, streaming_wav_header


@dataclass(frozen=True)
class Codec:
    container: str  # FFmpeg's muxer
    encoder: str  # FFmpeg's encoder
    media_type: str
    bit_rate: int | None = None
    options: tuple[tuple[str, str], ...] = ()  # the muxer's


# page_duration: an Ogg page per packet or so (20 ms) rather than one per second: streamed.
CODECS = {
    "mp3": Codec("mp3", "libmp3lame", "audio/mpeg", 64_000),
    "opus": Codec("ogg", "libopus", "audio/ogg", 32_000, (("page_duration", "20000"),)),
    "aac": Codec("adts", "aac", "audio/aac", 64_000),
    "flac": Codec("flac", "flac", "audio/flac"),
}
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", **{k: c.media_type for k, c in CODECS.items()}}
FORMATS = tuple(MEDIA_TYPES)
MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's bounds
ATEMPO_MIN, ATEMPO_MAX = 0.5, 2.0  # one atempo stage's range; stages chain for more


class _Sink:
    """A write-only file for PyAV (no `seek`: the muxer treats the output as a stream)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


def _frame(pcm: np.ndarray, pts: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = SAMPLE_RATE
    frame.pts = pts
    return frame


class _Muxed:
    """One encoder and muxer of CODECS, fed int16 samples."""

    def __init__(self, codec: Codec) -> None:
        self.sink = _Sink()
        self.out = av.open(self.sink, mode="w", format=codec.container, options=dict(codec.options))
        self.stream = self.out.add_stream(codec.encoder, rate=SAMPLE_RATE, layout="mono")
        if codec.bit_rate is not None:
            self.stream.bit_rate = codec.bit_rate
        self.pts = 0

    def encode(self, pcm: np.ndarray) -> bytes:
        if pcm.size:
            for packet in self.stream.encode(_frame(pcm, self.pts)):
                self.out.mux(packet)
            self.pts += pcm.size
        return self.sink.take()

    def finish(self) -> bytes:
        for packet in self.stream.encode(None):
            self.out.mux(packet)
        self.out.close()
        return self.sink.take()


def atempo_chain(speed: float) -> list[float]:
    """Factors within one atempo stage's range whose product is `speed`."""
    parts = []
    while speed < ATEMPO_MIN:
        parts.append(ATEMPO_MIN)
        speed /= ATEMPO_MIN
    while speed > ATEMPO_MAX:
        parts.append(ATEMPO_MAX)
        speed /= ATEMPO_MAX
    return [*parts, speed]


class TimeStretch:
    """FFmpeg's `atempo` (WSOLA: the tempo changes, the pitch does not), int16 in and out."""

    def __init__(self, speed: float) -> None:
        self.graph = av.filter.Graph()
        nodes = [self.graph.add_abuffer(format="s16", sample_rate=SAMPLE_RATE, layout="mono")]
        nodes += [self.graph.add("atempo", f"{f:.9g}") for f in atempo_chain(speed)]
        nodes.append(self.graph.add("abuffersink"))
        for a, b in zip(nodes, nodes[1:], strict=False):
            a.link_to(b)
        self.graph.configure()
        self.pts = 0

    def _pull(self) -> np.ndarray:
        out = []
        while True:
            try:
                frame = self.graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(out) if out else np.zeros(0, np.int16)

    def feed(self, pcm: np.ndarray) -> np.ndarray:
        if not pcm.size:
            return pcm
        self.graph.push(_frame(pcm, self.pts))
        self.pts += pcm.size
        return self._pull()

    def finish(self) -> np.ndarray:
        self.graph.push(None)
        return self._pull()


class SpeechEncoder:
    """PCM16 chunks in, bytes of `fmt` out as they are made (`encode`), the rest at `finish`."""

    def __init__(self, fmt: str, speed: float = 1.0) -> None:
        if fmt not in MEDIA_TYPES:
            raise ValueError(f"unknown format {fmt!r}")
        self.fmt = fmt
        self.stretch = TimeStretch(speed) if speed != 1.0 else None
        self.muxed = _Muxed(CODECS[fmt]) if fmt in CODECS else None
        self.head = streaming_wav_header(SAMPLE_RATE) if fmt == "wav" else b""

    def _out(self, pcm: np.ndarray) -> bytes:
        head, self.head = self.head, b""
        if self.muxed is not None:
            return head + self.muxed.encode(pcm)
        return head + pcm.astype("<i2", copy=False).tobytes()

    def encode(self, pcm: bytes) -> bytes:
        samples = np.frombuffer(pcm, dtype="<i2")
        if self.stretch is not None:
            samples = self.stretch.feed(samples)
        return self._out(samples)

    def finish(self) -> bytes:
        rest = self._out(self.stretch.finish()) if self.stretch is not None else self._out(np.zeros(0, np.int16))
        if self.muxed is not None:
            rest += self.muxed.finish()
        return rest

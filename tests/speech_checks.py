"""What the speech tests share: a pipeline served with the HTTP server, PyAV decoding of every
response format, and the oracle check of a given reply's talker codes and waveform."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import av
import numpy as np
import yaml

from tests.launcher import ServedPipeline, serve, wait_healthy

KEY = "speech-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_http(config: Path, tmp: Path, **top: Any) -> Iterator[tuple[ServedPipeline, str]]:
    """The pipeline of `config` (with top-level keys `top` set) and its HTTP server; (pipeline, url)."""
    raw = yaml.safe_load(config.read_text())
    raw.update(top)
    path = tmp / config.name
    path.write_text(yaml.safe_dump(raw))
    url = f"http://127.0.0.1:{_free_port()}"
    with serve(path, "--http", url.removeprefix("http://"), "--api-key", KEY) as pipeline:
        wait_healthy(url, pipeline)
        yield pipeline, url


@contextmanager
def serve_tiny_tts(tmp: Path, max_tokens: int, model: str | None = None) -> Iterator[tuple[ServedPipeline, str]]:
    """tiny_qwen3_tts.yaml served over HTTP with the talker's `max_tokens` (a short answer) and, if
    given, another tiny Qwen3-TTS checkpoint in both stages (e.g. the Base one)."""
    from omni_mp.stage_configs import CONFIG_DIR

    raw = yaml.safe_load((CONFIG_DIR / "tiny_qwen3_tts.yaml").read_text())
    for stage in raw["stages"] if model else []:
        stage["model"] = model
    raw["stages"][0]["sampling"]["max_tokens"] = max_tokens
    config = tmp / "tts.yaml"
    config.write_text(yaml.safe_dump(raw))
    with serve_http(config, tmp) as got:
        yield got


class Decoded:
    """A response body decoded by PyAV (FFmpeg): mono float32 samples and what the stream says."""

    def __init__(self, data: bytes) -> None:
        with av.open(io.BytesIO(data)) as f:
            stream = f.streams.audio[0]
            self.codec = stream.codec_context.name
            self.rate = stream.codec_context.sample_rate
            self.channels = stream.codec_context.channels
            parts = [fr.to_ndarray().reshape(-1) for fr in f.decode(stream)]  # (mono: no interleaving)
        samples = np.concatenate(parts)
        self.samples = samples / np.float32(32768) if samples.dtype == np.int16 else samples.astype(np.float32)


def opus_input_rate(data: bytes) -> int:
    """The input sample rate an Ogg Opus stream's OpusHead records (RFC 7845 5.1)."""
    head = data.index(b"OpusHead")
    return int.from_bytes(data[head + 12 : head + 16], "little")


def pcm_samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768


def corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def check_livekit_plays_the_mp3(got: dict[str, Any], mp3: np.ndarray) -> None:
    """What LiveKit's OpenAI TTS plugin decoded (tests/clients/livekit_tts.py's output) is the mp3
    answer of the same request: 24 kHz mono, the same length within a frame, correlated once
    aligned (its decoder starts a frame, 576 samples, later than FFmpeg's: the lag is searched)."""
    assert got["rates"] == [24_000] and got["channels"] == [1]
    pcm = got["pcm"].astype(np.float32) / 32768
    assert abs(pcm.size - mp3.size) <= 1152, (pcm.size, mp3.size)
    m = pcm.size - 1152
    best, lag = max((corr(pcm[:m], mp3[k : k + m]), k) for k in range(0, 1153))
    print(f"[livekit] {pcm.size} samples, {lag} after PyAV's decode of the mp3; correlation {best:.4f}")
    assert best >= 0.98  # (the same samples decoded twice; a misaligned noise-like signal gives ~0)

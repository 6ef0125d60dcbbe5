"""What the speech tests share: a pipeline served with the HTTP server, PyAV decoding of every
response format and its check against the pcm answer, the SSE stream's check, and LiveKit's plugin
against the mp3 answer."""

from __future__ import annotations

import base64
import io
import json
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import av
import numpy as np
import openai
import yaml

from omni_mp.media.audio_io import resample
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


MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "mp3": "audio/mpeg", "opus": "audio/ogg",
               "aac": "audio/aac", "flac": "audio/flac"}  # fmt: skip
PRIMING = {"mp3": 1105, "aac": 1024}  # samples LAME and FFmpeg's AAC put before the signal


def speech_answer(client: openai.OpenAI, fmt: str, **request: Any) -> tuple[str, bytes]:
    """One POST /v1/audio/speech through the `openai` SDK (`request`: voice, input, extra_body):
    the answer's content type and its bytes, as streamed."""
    with client.audio.speech.with_streaming_response.create(model="tiny", response_format=fmt, **request) as r:
        assert r.status_code == 200
        return r.headers["content-type"], b"".join(r.iter_bytes())


def check_every_format(client: openai.OpenAI, min_corr: Mapping[str, float], **request: Any) -> dict[str, float]:
    """The same request in each response format: its media type, and PyAV decodes it to 24 kHz
    mono (Opus: 48 kHz, its decoders' one rate, with 24 kHz in its header) holding the pcm answer's
    samples: wav and flac exactly, pcm again the same, the lossy codecs (past their priming) with a
    correlation of at least `min_corr[fmt]`. Returns the correlations measured."""
    ref = pcm_samples(speech_answer(client, "pcm", **request)[1])
    n = ref.size
    assert n > 24_000 // 2
    measured: dict[str, float] = {}
    for fmt, media_type in MEDIA_TYPES.items():
        content_type, data = speech_answer(client, fmt, **request)
        assert content_type == media_type, (fmt, content_type)
        if fmt == "pcm":
            assert np.array_equal(pcm_samples(data), ref)  # the same request again: the same audio
            continue
        d = Decoded(data)
        assert d.channels == 1, fmt
        got = d.samples
        if fmt == "opus":
            assert d.rate == 48_000 and opus_input_rate(data) == 24_000 and got.size == 2 * n
            got = resample(got, 48_000, 24_000)
        else:
            assert d.rate == 24_000, fmt
        if fmt in ("wav", "flac"):
            assert np.array_equal(got, ref), fmt
            continue
        lag = PRIMING.get(fmt, 0)
        assert n <= got.size - lag <= n + 2304, (fmt, got.size, n)
        measured[fmt] = corr(got[lag : lag + n], ref)
        print(f"[{fmt}] {got.size} samples decoded for {n}; correlation with the pcm answer {measured[fmt]:.3f}")
        assert measured[fmt] >= min_corr[fmt], (fmt, measured[fmt])
    return measured


def sse_events(client: openai.OpenAI, fmt: str, **request: Any) -> list[dict[str, Any]]:
    """The request with `stream_format: "sse"`: its events, in order."""
    with client.audio.speech.with_streaming_response.create(
        model="tiny", response_format=fmt, stream_format="sse", **request
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line[len("data: ") :]) for line in r.iter_lines() if line.startswith("data: ")]


def check_sse_is_the_answer(client: openai.OpenAI, fmt: str, min_deltas: int = 2, **request: Any) -> dict[str, Any]:
    """The request as SSE: `speech.audio.delta` events, at least `min_deltas` (the audio sent in
    pieces as made), then one `speech.audio.done`; the deltas' bytes are the answer of the same
    request not streamed as SSE. Returns the done event's usage."""
    events = sse_events(client, fmt, **request)
    types = [e["type"] for e in events]
    assert types[-1] == "speech.audio.done" and types[:-1] == ["speech.audio.delta"] * (len(types) - 1)
    assert len(types) - 1 >= min_deltas, types
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == speech_answer(client, fmt, **request)[1]
    return events[-1]["usage"]

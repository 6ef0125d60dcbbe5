"""The OpenAI-compatible HTTP server (omni_mp.http) end to end: one real launcher with
`--http` and `--api-key` on the tiny Qwen2.5-Omni pipeline (CPU), driven by the official
`openai` client (and raw httpx where the wire format itself is checked), against what our
ZMQ client gets from the same pipeline for the same request."""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import openai
import psutil
import pytest
import soundfile
import torch
import yaml
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.config.validate import load_config
from omni_mp.http.metrics import PREPARE_PARTS
from omni_mp.models.qwen2_5_omni.prompt import SPEECH_SYSTEM_PROMPT, omni_prompt_text
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.client_scripts import client_script
from tests.hf_oracle import assert_close_audio, assert_same_tokens, conversation_inputs, omni_generate
from tests.launcher import ServedPipeline, serve, settled_client, wait_healthy
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.engine

BASE_CONFIG = CONFIG_DIR / "tiny_qwen2_5_omni.yaml"
KEY = "test-key-123"
MAX_INFLIGHT = 32
PCM_LSB = 1 / 32768  # one step of 16-bit PCM as soundfile reads it
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # the playground test's browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, pipeline: ServedPipeline, url: str, config: Path) -> None:
        self.pipeline = pipeline
        self.url = url
        self.config = config
        self.cfg = load_config(config)
        self.openai = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The tiny pipeline with a small admission limit (for 429) and one restart of token2wav."""
    raw = yaml.safe_load(BASE_CONFIG.read_text())
    raw["admission"] = {"max_inflight": MAX_INFLIGHT}
    raw["stages"][2]["restart"] = {"max_restarts": 1, "backoff_s": 0.1}
    # The thinker's prefix cache on (text-only answers read it; spoken ones compute every row).
    raw["stages"][0]["engine_args"].update(enable_prefix_caching=True, block_size=16)
    config = tmp_path_factory.mktemp("http") / "tiny_http.yaml"
    config.write_text(yaml.safe_dump(raw))
    url = f"http://127.0.0.1:{_free_port()}"
    with serve(config, "--http", url.removeprefix("http://"), "--api-key", KEY) as pipeline:
        wait_healthy(url, pipeline)
        yield Served(pipeline, url, config)
        http_procs = [p for p in pipeline.descendants() if "omni_mp.http" in " ".join(p.cmdline())]
        assert len(http_procs) == 1
    assert not psutil.pid_exists(http_procs[0].pid) or http_procs[0].status() == psutil.STATUS_ZOMBIE


@pytest.fixture
def zmq(served: Served) -> Iterator[OmniClient]:
    with settled_client(served.pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


def _b64_wav(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "FLOAT") -> str:
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt, subtype=subtype)
    return base64.b64encode(buf.getvalue()).decode()


def _png_data_url(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _audio_sampling(served: Served, seed: int) -> dict[int, SamplingParamsMsg]:
    """What a request with `seed` means for the stages: the thinker's and the noise's seed."""
    s0, s2 = served.cfg.stage(0).sampling, served.cfg.stage(2).sampling
    return {0: msgspec.structs.replace(s0, seed=seed), 2: msgspec.structs.replace(s2, seed=seed)}


def _decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def _assert_pcm_equal(got: np.ndarray, want: np.ndarray) -> None:
    """16-bit PCM of `want`: the same length, every sample within one PCM step."""
    want = np.clip(np.asarray(want, dtype=np.float32), -1, 1)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(got - want).max() <= 2 * PCM_LSB
    assert np.abs(want).max() > 100 * PCM_LSB  # not silence


def _audio(done: Finished) -> np.ndarray:
    """The last stage's audio (the client gives numpy or torch arrays)."""
    return np.asarray(done.outputs[-1].audio, dtype=np.float32)


def _spoken(text: str) -> dict[str, object]:
    """The ZMQ request of a spoken one-message chat: Qwen2.5-Omni's speech system prompt."""
    return {"prompt": omni_prompt_text(text, system=SPEECH_SYSTEM_PROMPT), "chat_formatted": True}


def _text(done: Finished) -> str:
    return next(o.text for o in done.outputs if o.stage_id == 0)


def test_text_only_equals_the_zmq_client(served: Served, zmq: OmniClient) -> None:
    got = served.openai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me a short story about the sea."}]
    )
    want = zmq.generate("Tell me a short story about the sea.", deadline_s=600)
    choice = got.choices[0]
    assert choice.message.content == _text(want) and choice.message.audio is None
    assert choice.finish_reason == next(o.finish_reason for o in want.outputs if o.stage_id == 0)
    t0 = next(t for t in want.stage_timings if t.stage_id == 0)
    assert got.usage is not None and got.usage.prompt_tokens == t0.num_prompt_tokens
    assert got.usage.completion_tokens == t0.num_output_tokens


def _histogram(served: Served, family: str, *labels: str) -> dict[tuple[str, ...], tuple[float, float]]:
    """(_sum, _count) of a histogram on /metrics, by the values of `labels`."""
    text = httpx.get(f"{served.url}/metrics", headers=_auth(), timeout=30).text
    got: dict[tuple[str, ...], list[float]] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name in (f"{family}_sum", f"{family}_count"):
                key = tuple(s.labels[k] for k in labels)
                got.setdefault(key, [0.0, 0.0])[s.name.endswith("_count")] = s.value
    return {k: (v[0], v[1]) for k, v in got.items()}


def _stage_counts(served: Served) -> dict[str, float]:
    """Per stage: how many requests it finished (its time-to-first-token observations)."""
    got = _histogram(served, "omni_mp_stage_time_to_first_token_seconds", "stage_id")
    return {k[0]: count for k, (_, count) in got.items()}


def test_text_only_runs_only_the_stages_a_text_answer_needs(served: Served, zmq: OmniClient) -> None:
    """modalities ["text"]: the request is registered with the thinker alone. The talker and
    token2wav never take it (no output, no StageDone from them, which a request registered
    there gives even when its text is done first), and the text equals a full run's."""
    before = _stage_counts(served)
    got = served.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello there"}])
    after = _stage_counts(served)
    assert after.get("0", 0) == before.get("0", 0) + 1
    assert after.get("1", 0) == before.get("1", 0) and after.get("2", 0) == before.get("2", 0)
    text_only = zmq.generate("Hello there", final_stages=[0], deadline_s=600)
    assert [o.stage_id for o in text_only.outputs] == [0] == [t.stage_id for t in text_only.stage_timings]
    full = zmq.generate("Hello there", deadline_s=600)
    assert [t.stage_id for t in full.stage_timings] == [0, 1, 2]
    assert got.choices[0].message.content == _text(text_only) == _text(full)
    with pytest.raises(RequestError, match="not a final stage"):
        zmq.generate("Hello there", final_stages=[7], deadline_s=60)


def test_text_and_audio_wav_equals_the_zmq_client(served: Served, zmq: OmniClient) -> None:
    prompt = "Hello there"
    got = served.openai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "wav"}, seed=7,
    )  # fmt: skip
    want = zmq.generate(**_spoken(prompt), speaker="Ethan", sampling=_audio_sampling(served, 7), deadline_s=600)
    msg = got.choices[0].message
    assert msg.audio is not None and msg.content == _text(want) and msg.audio.transcript == msg.content
    samples, rate = _decode_wav(base64.b64decode(msg.audio.data))
    assert rate == 24_000
    _assert_pcm_equal(samples, _audio(want))
    pcm = served.openai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "pcm16"}, seed=7,
    )  # fmt: skip
    assert pcm.choices[0].message.audio is not None
    raw = np.frombuffer(base64.b64decode(pcm.choices[0].message.audio.data), dtype="<i2")
    _assert_pcm_equal(raw.astype(np.float32) / 32768, _audio(want))


def test_streaming_order_and_first_audio_before_the_last_token(served: Served, zmq: OmniClient) -> None:
    """Text deltas and audio chunks interleave as produced: the first audio comes before the
    thinker's last token; then the transcript, finish_reason, usage; the PCM equals ZMQ's."""
    prompt = "Tell me a long story."
    stream = served.openai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], modalities=["text", "audio"],
        audio={"voice": "Chelsie", "format": "pcm16"}, max_completion_tokens=400, stream=True,
        stream_options={"include_usage": True}, seed=3,
    )  # fmt: skip
    kinds, text, pcm, transcript, usage, finish = [], [], [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            kinds.append("usage")
            continue
        delta = chunk.choices[0].delta
        audio = delta.audio  # the SDK's ChoiceDeltaAudio
        if delta.content:
            text.append(delta.content)
            kinds.append("text")
        if audio is not None and audio.data:
            pcm.append(base64.b64decode(audio.data))
            kinds.append("audio")
        if audio is not None and audio.transcript is not None:
            transcript = audio.transcript
            kinds.append("transcript")
        if chunk.choices[0].finish_reason is not None:
            finish = chunk.choices[0].finish_reason
            kinds.append("finish")
    assert kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("text"), "first audio after the last token"
    assert kinds[-3:] == ["transcript", "finish", "usage"]
    sampling = _audio_sampling(served, 3)
    sampling[0] = msgspec.structs.replace(sampling[0], max_tokens=400)
    want = zmq.generate(**_spoken(prompt), speaker="Chelsie", sampling=sampling, deadline_s=600)
    assert "".join(text) == transcript == _text(want)
    assert finish == next(o.finish_reason for o in want.outputs if o.stage_id == 0)
    assert usage is not None and usage.completion_tokens == len(want.outputs[0].token_ids)
    audio = np.frombuffer(b"".join(pcm), dtype="<i2").astype(np.float32) / 32768
    _assert_pcm_equal(audio, _audio(want))


def test_sse_wire_format_ends_with_done(served: Served) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    with httpx.stream("POST", f"{served.url}/v1/chat/completions", json=body, headers=_auth(), timeout=600) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_audio_input_in_any_format_equals_the_zmq_client(served: Served, zmq: OmniClient, fmt: str) -> None:
    samples = tone()
    data = {
        "wav": _b64_wav(samples, 16_000),
        "flac": "data:audio/flac;base64," + _b64_wav(samples, 16_000, "FLAC", "PCM_16"),
        "mp3": _b64_wav(samples, 16_000, "MP3", "MPEG_LAYER_III"),
    }[fmt]
    decoded, rate = soundfile.read(io.BytesIO(base64.b64decode(data.split(",")[-1])), dtype="float32")
    content = [  # (parts render in order: the audio before the text, as the ZMQ client renders it)
        {"type": "input_audio", "input_audio": {"data": data, "format": fmt}},
        {"type": "text", "text": "What do you hear?"},
    ]
    got = served.openai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}])
    want = zmq.generate("What do you hear?", audios=[(decoded, rate)], deadline_s=600)
    assert got.choices[0].message.content == _text(want)


def test_image_input_equals_the_zmq_client(served: Served, zmq: OmniClient) -> None:
    content = [
        {"type": "image_url", "image_url": {"url": _png_data_url(pattern())}},
        {"type": "text", "text": "Describe the picture."},
    ]
    got = served.openai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}])
    want = zmq.generate("Describe the picture.", images=[pattern()], deadline_s=600)
    assert got.choices[0].message.content == _text(want)


# /v1/audio/speech: tests/test_http_speech.py


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def _error(served: Served, body: object, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    r = httpx.post(f"{served.url}{path}", content=json.dumps(body), headers=_auth(), timeout=600)
    return r.status_code, r.json()["error"]


def test_errors_have_openai_shape_and_name_the_param(served: Served) -> None:
    hello = [{"role": "user", "content": "Hello"}]
    ogg = {"voice": "Ethan", "format": "ogg"}
    bad_b64 = {"type": "input_audio", "input_audio": {"data": "###", "format": "wav"}}
    cases = [
        ({"model": "m", "messages": hello, "foo": 1}, "foo"),
        ({"model": "m", "messages": hello, "temperature": 5}, "temperature"),
        ({"model": "m", "messages": hello, "top_p": 0}, "top_p"),
        ({"model": "m", "messages": hello, "n": 2}, "n"),
        ({"model": "m", "messages": hello, "modalities": ["audio"]}, "modalities"),
        ({"model": "m", "messages": hello, "modalities": ["text", "audio"]}, "audio"),
        ({"model": "m", "messages": hello, "modalities": ["text", "audio"], "audio": ogg}, "audio.format"),
        ({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Look"}, {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}]},
         "messages[0].content[1].image_url.url"),
        ({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Hear"}, bad_b64]}]},
         "messages[0].content[1].input_audio.data"),
    ]  # fmt: skip
    for body, param in cases:
        status, err = _error(served, body)
        assert status == 400 and err["param"] == param, (body, err)
        assert err["type"] == "invalid_request_error" and err["message"] and err["code"]
    status, err = _error(served, {"model": "m", "messages": hello, "modalities": ["text", "audio"],
                                  "audio": {"voice": "Nobody", "format": "wav"}})  # fmt: skip
    assert status == 400 and err["param"] == "audio.voice" and "Chelsie" in err["message"] and "Ethan" in err["message"]
    status, err = _error(served, {"model": "m", "input": "Hi", "voice": "Nobody"}, "/v1/audio/speech")
    assert status == 400 and err["param"] == "voice" and "Ethan" in err["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        served.openai.chat.completions.create(model="m", messages=hello, n=3)  # type: ignore[arg-type]
    assert raised.value.param == "n"


def test_oversize_body_and_media_are_refused_before_decoding(served: Served) -> None:
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)  # declares 1 GB, sends none of it
    conn.putrequest("POST", "/v1/chat/completions")
    for name, value in [*_auth().items(), ("Content-Type", "application/json"), ("Content-Length", "1000000000")]:
        conn.putheader(name, value)
    conn.endheaders()
    reply = conn.getresponse()
    assert reply.status == 400 and json.loads(reply.read())["error"]["param"] == "body"
    conn.close()
    long_audio = _b64_wav(np.zeros(1000 * 301, np.float32), 1000, subtype="PCM_16")  # 301 s > max_audio_s
    content = [
        {"type": "text", "text": "Hear"},
        {"type": "input_audio", "input_audio": {"data": long_audio, "format": "wav"}},
    ]
    status, err = _error(served, {"model": "m", "messages": [{"role": "user", "content": content}]})
    assert (
        status == 400 and err["param"] == "messages[0].content[1].input_audio.data" and "max_audio_s" in err["message"]
    )


def test_api_key_on_every_endpoint_but_health(served: Served) -> None:
    for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/chat/completions"),
                         ("POST", "/v1/audio/speech")]:  # fmt: skip
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.request(method, f"{served.url}{path}", headers=headers, json={}, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    assert httpx.get(f"{served.url}/health", timeout=30).status_code == 200
    models = served.openai.models.list()
    assert [m.id for m in models.data] == [served.cfg.name]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="nope", max_retries=0).models.list()


def _long_body(stream: bool) -> dict:
    return {
        "model": "m", "messages": [{"role": "user", "content": "Tell me everything."}], "stream": stream,
        "max_completion_tokens": 1900, "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"},
    }  # fmt: skip


def _wait_idle(zmq: OmniClient, timeout_s: float) -> float:
    t0 = time.monotonic()
    while zmq.status().inflight and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)
    return time.monotonic() - t0


def _outcomes(served: Served) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{served.url}/metrics", headers=_auth(), timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "omni_mp_http_requests_total":
                out[(s.labels["endpoint"], s.labels["code"])] = s.value
    return out


def test_client_disconnect_aborts_the_request(served: Served, zmq: OmniClient) -> None:
    """A streaming client that goes away, and a waiting non-streaming one: the pipeline
    aborts the request (nothing stays in flight) long before it would have finished."""
    before = _outcomes(served).get(("chat", "client_disconnected"), 0)
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=_long_body(True), headers=_auth(), timeout=600
    ) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert zmq.status().inflight == 1
    assert _wait_idle(zmq, 10) < 10
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{served.url}/v1/chat/completions", json=_long_body(False), headers=_auth(), timeout=2)
    assert _wait_idle(zmq, 10) < 10
    assert _outcomes(served).get(("chat", "client_disconnected"), 0) == before + 2


def test_overload_is_429_with_retry_after(served: Served, zmq: OmniClient) -> None:
    """With admission.max_inflight requests in flight (long ones, from the ZMQ client), a
    new HTTP request gets 429 with Retry-After at once."""
    long = {0: msgspec.structs.replace(served.cfg.stage(0).sampling, max_tokens=1900)}
    with concurrent.futures.ThreadPoolExecutor(MAX_INFLIGHT) as pool:
        holds = [
            pool.submit(zmq.generate, "Tell me everything.", sampling=long, request_id=f"hold{i}", deadline_s=600)
            for i in range(MAX_INFLIGHT)
        ]
        try:
            deadline = time.monotonic() + 60
            while zmq.status().inflight < MAX_INFLIGHT:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            status, err = _error(served, {"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
            assert status == 429 and err["code"] == "overloaded" and err["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError) as raised:
                served.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
            assert raised.value.response.headers["retry-after"] == "1"
        finally:
            for i in range(MAX_INFLIGHT):
                zmq.abort(f"hold{i}")
        for fut in holds:
            with pytest.raises(RequestError, match="aborted"):
                fut.result()
    assert _wait_idle(zmq, 10) < 10


def test_32_concurrent_requests_each_end_exactly_once(served: Served, zmq: OmniClient) -> None:
    """Streaming and non-streaming, text and spoken, all in flight together: each ends once
    (one finish_reason; streams one [DONE]) and the outcome counter grows by exactly 32."""
    before = _outcomes(served).get(("chat", "ok"), 0)

    def one(i: int) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": f"Count to {i}."}], "max_completion_tokens": 8}
        if i % 4 == 0:
            body |= {
                "modalities": ["text", "audio"],
                "audio": {"voice": ("Ethan", "Chelsie")[i % 8 // 4], "format": "pcm16"},
            }
        if i % 2:
            r = httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=_auth(), timeout=900)
            assert r.status_code == 200, r.text
            return int(r.json()["choices"][0]["finish_reason"] in ("stop", "length"))
        body["stream"] = True
        with httpx.stream("POST", f"{served.url}/v1/chat/completions", json=body, headers=_auth(), timeout=900) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line]
        assert events.count("data: [DONE]") == 1 and events[-1] == "data: [DONE]"
        return sum(json.loads(e[6:])["choices"][0]["finish_reason"] is not None for e in events[:-1])

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        ends = list(pool.map(one, range(32)))
    assert ends == [1] * 32
    assert _outcomes(served).get(("chat", "ok"), 0) == before + 32
    assert _wait_idle(zmq, 10) < 10


def test_metrics_parse_with_per_stage_labels(served: Served) -> None:
    hello = [{"role": "user", "content": "Hi"}]
    start, first = "omni_mp_stage_time_to_start_seconds", "omni_mp_stage_time_to_first_token_seconds"
    prepare = "omni_mp_stage_prepare_seconds"
    by = {start: ("stage_id",), first: ("stage_id",), prepare: ("stage_id", "part")}
    before = {name: _histogram(served, name, *labels) for name, labels in by.items()}
    served.openai.chat.completions.create(
        model="m", messages=hello, modalities=["text", "audio"], audio={"voice": "Ethan", "format": "wav"}
    )  # fmt: skip
    d = {  # what this one request added: (sum, count) by labels
        name: {k: (v[0] - before[name].get(k, (0.0, 0.0))[0], v[1] - before[name].get(k, (0.0, 0.0))[1])
               for k, v in _histogram(served, name, *labels).items()}
        for name, labels in by.items()
    }  # fmt: skip
    for stage in ("0", "1", "2"):  # this one request: each stage started it before its first token
        assert d[start][(stage,)][1] == d[first][(stage,)][1] == 1, (stage, d)
        assert 0 <= d[start][(stage,)][0] <= d[first][(stage,)][0], (stage, d)
        parts = {part: v for (s, part), v in d[prepare].items() if s == stage and v[1]}
        if stage == "0":  # the entry stage prepares off its engine thread: its parts add up to its start
            assert sorted(parts) == sorted(PREPARE_PARTS) and all(v[1] == 1 for v in parts.values()), parts
            assert abs(sum(v[0] for v in parts.values()) - d[start][(stage,)][0]) < 1e-3, (parts, d)
        else:
            assert not parts, (stage, parts)
    assert _error(served, {"model": "m", "messages": hello, "foo": 1})[0] == 400
    text = httpx.get(f"{served.url}/metrics", headers=_auth(), timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("omni_mp_stage_ready", "omni_mp_stage_output_tokens", first, start):
        ids = {s.labels["stage_id"] for s in families[name].samples}
        assert ids == {"0", "1", "2"}, (name, ids)
    ready = {s.labels["stage_id"]: s.value for s in families["omni_mp_stage_ready"].samples}
    assert ready == {"0": 1.0, "1": 1.0, "2": 1.0}
    outcomes = _outcomes(served)
    assert outcomes[("chat", "ok")] >= 1 and outcomes[("chat", "unknown_field")] >= 1
    assert families["omni_mp_http_time_to_first_audio_seconds"].samples
    _assert_stage_stats(served)


def _stage_stats(served: Served) -> dict[str, dict[tuple[str, ...], float]]:
    """The series the stages report with their heartbeats: family -> labels -> value."""
    text = httpx.get(f"{served.url}/metrics", headers=_auth(), timeout=30).text
    names = ("requests_running", "requests_waiting", "engine_steps", "engine_step_seconds", "sent_bytes")
    wanted = {f"omni_mp_stage_{n}" for n in names}
    return {
        f.name: {(s.labels["stage_id"], s.labels.get("downstream", "")): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
        if f.name in wanted
    }


def _assert_stage_stats(served: Served) -> None:
    """Every stage reports its load, engine steps and step time, and every link its bytes: after
    a request, within a few heartbeats, each counter is above zero and, every request having
    ended, no stage holds one (running and waiting are 0)."""
    stages = {str(s.id) for s in served.cfg.stages}
    links = {(str(up), str(s.id)) for s in served.cfg.stages for up in s.inputs}
    deadline = time.monotonic() + 10 * served.cfg.timeouts.heartbeat_interval_s
    while True:
        stats = _stage_stats(served)
        counters = [stats.get(f"omni_mp_stage_{n}", {}) for n in ("engine_steps", "engine_step_seconds", "sent_bytes")]
        gauges = [stats.get(f"omni_mp_stage_{n}", {}) for n in ("requests_running", "requests_waiting")]
        settled = all(v > 0 for c in counters for v in c.values()) and all(v == 0 for g in gauges for v in g.values())
        if settled and set(stats.get("omni_mp_stage_sent_bytes", {})) == links:
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    for name in ("requests_running", "requests_waiting", "engine_steps", "engine_step_seconds"):
        assert {sid for sid, _ in stats[f"omni_mp_stage_{name}"]} == stages, (name, stats)


# ---- conversations (omni_mp.http.conversation) against transformers ----------------------------
# Qwen2.5-Omni: text, codes and waveform of each spoken answer equal transformers' generate() on
# the same conversation (fp32, greedy thinker and talker, the token2wav noise of seed 0), its
# prompt ids the processor's `apply_chat_template` + processor. Waveform tolerance: HTTP's 16-bit
# WAV against transformers' one-shot float waveform, relative L2 <= 1e-3 (assert_close_audio: the
# streamed-vs-one-shot bound; measured on these conversations: see CONV_WAV_REL).
CONV_TOKENS = 12  # thinker tokens per answer (max_completion_tokens)
CONV_VOICE = "Ethan"
CONV_MIN_MARGIN = 1e-5
CONV_WAV_REL = 1e-3
CONV_AUDIO, CONV_IMAGE = tone(1.0), pattern(56)
CONV_TURN1 = [
    {"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": _b64_wav(CONV_AUDIO, 16_000), "format": "wav"}},
        {"type": "text", "text": "What do you hear?"},
    ]},
]  # fmt: skip
CONV_LATER = [
    {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _png_data_url(CONV_IMAGE)}}, {"type": "text", "text": "And this?"},
    ]},
    {"role": "assistant", "content": "A picture of stripes."},
    {"role": "user", "content": "Which colours?"},
    {"role": "assistant", "content": "Red and green."},
    {"role": "user", "content": "Thanks. Bye."},
]  # fmt: skip


def _hf_conversation(messages: list[dict], transcripts: dict[str, str]) -> tuple[list[dict], list, list]:
    """The conversation as transformers' chat template takes it (the model card's speech system
    prompt first, then the client's system text; an audio id as its transcript), and its media."""
    kinds = {"input_audio": "audio", "image_url": "image"}
    system = [m["content"] for m in messages if m["role"] == "system"]
    out: list[dict] = [{"role": "system", "content": "\n\n".join([SPEECH_SYSTEM_PROMPT, *system])}]
    audios, images = [], []
    for m in messages:
        if m["role"] == "system":
            continue
        if "audio" in m:
            out.append({"role": m["role"], "content": transcripts[m["audio"]["id"]]})
        elif isinstance(m["content"], list):
            parts = [{"type": kinds.get(p["type"], "text"), "text": p.get("text")} for p in m["content"]]
            out.append({"role": m["role"], "content": [{k: v for k, v in p.items() if v is not None} for p in parts]})
            audios += [CONV_AUDIO for p in m["content"] if p["type"] == "input_audio"]
            images += [CONV_IMAGE for p in m["content"] if p["type"] == "image_url"]
        else:
            out.append(m)
    return out, audios, images


def _server_prompt(messages: list[dict], transcripts: dict[str, str]) -> Any:
    """The thinker's prompt the server's history builder renders for `messages` (spoken)."""
    from transformers import AutoTokenizer

    from omni_mp.config.schema import MediaLimits
    from omni_mp.http.audio_ids import MemoryAudioStore
    from omni_mp.http.conversation import from_messages, render
    from omni_mp.http.media import MediaSizes
    from omni_mp.http.schemas import ChatMessage
    from omni_mp.models.qwen2_5_omni.prompt import CHAT

    plain = [{"role": "assistant", "content": transcripts[m["audio"]["id"]]} if "audio" in m else m for m in messages]
    parsed = [msgspec.convert(m, ChatMessage) for m in plain]
    conv = from_messages(parsed, MediaSizes(max_media_bytes=1 << 24), MediaLimits(max_audio_s=30.0), MemoryAudioStore())
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny-qwen2_5-omni"))
    return render(conv, CHAT, tok.apply_chat_template, speak=True)


def _zmq_run(zmq: OmniClient, served: Served, prompt: Any) -> tuple[list[int], list[int], list[int], str | None]:
    """The rendered conversation through the ZMQ client: (the thinker's prompt ids, its tokens,
    the talker's codes, the talker's finish reason)."""
    sampling = {0: msgspec.structs.replace(served.cfg.stage(0).sampling, max_tokens=CONV_TOKENS)}
    prompt_ids: list[int] = []
    tokens: dict[int, list[int]] = {0: [], 1: []}
    talker_end = None
    for ev in zmq.stream(
        prompt.text, chat_formatted=True, audios=[(a, r) for a, r in prompt.audios], images=list(prompt.images),
        speaker=CONV_VOICE, sampling=sampling, deadline_s=900,
    ):  # fmt: skip
        if not isinstance(ev, StageOutputChunk) or ev.stage_id not in tokens:
            continue
        if ev.stage_id == 0 and ev.prompt_token_ids is not None:
            prompt_ids = list(ev.prompt_token_ids)
        tokens[ev.stage_id] += list(ev.token_ids)
        if ev.stage_id == 1 and ev.finished:
            talker_end = ev.finish_reason
    return prompt_ids, tokens[0], tokens[1], talker_end


def _conversation_turn(served: Served, zmq: OmniClient, messages: list[dict], transcripts: dict[str, str]) -> str:
    """One spoken answer over HTTP against transformers; returns its audio id (transcript kept)."""
    from transformers import AutoTokenizer

    model_dir = resolve_model("tiny-qwen2_5-omni")
    hf_messages, audios, images = _hf_conversation(messages, transcripts)
    inputs = conversation_inputs(model_dir, hf_messages, audios, images)
    want = omni_generate(model_dir, "", speaker=CONV_VOICE, thinker_max_new_tokens=CONV_TOKENS, inputs=inputs)
    assert min(want.thinker_margins) > CONV_MIN_MARGIN and min(want.code_margins) > CONV_MIN_MARGIN
    msg = served.openai.chat.completions.create(
        model="m", messages=messages, modalities=["text", "audio"], audio={"voice": CONV_VOICE, "format": "wav"},
        max_completion_tokens=CONV_TOKENS,
    ).choices[0].message  # fmt: skip
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    said = want.thinker_ids[: want.thinker_ids.index(eos)] if eos in want.thinker_ids else want.thinker_ids
    assert msg.audio is not None and msg.content == tok.decode(said) == msg.audio.transcript
    wav, rate = _decode_wav(base64.b64decode(msg.audio.data))
    got, ref = torch.from_numpy(wav), want.wav.float()
    print(f"waveform relative L2 error {((got - ref).norm() / ref.norm()).item():.2e}")  # the measured tolerance
    assert rate == 24_000
    assert_close_audio(got, ref)
    prompt_ids, thinker, codes, talker_end = _zmq_run(zmq, served, _server_prompt(messages, transcripts))
    assert prompt_ids == inputs["input_ids"][0].tolist()
    assert_same_tokens(thinker, want.thinker_ids, want.thinker_margins, "thinker")
    assert_same_tokens(codes[:-1] if talker_end == "stop" else codes, want.codes, want.code_margins, "talker")
    transcripts[msg.audio.id] = msg.audio.transcript
    return msg.audio.id


def test_qwen2_5_omni_conversations_of_1_2_and_4_turns_equal_transformers(served: Served, zmq: OmniClient) -> None:
    """Spoken answers to conversations of 1, 2 and 4 user turns (an audio and an image in
    earlier turns; the 2-turn one continues the first answer by its audio id) equal
    transformers' generate() on the same conversation: prompt ids, text, codes, waveform."""
    transcripts: dict[str, str] = {}
    first = _conversation_turn(served, zmq, CONV_TURN1, transcripts)
    two = [*CONV_TURN1, {"role": "assistant", "audio": {"id": first}}, CONV_LATER[0]]
    _conversation_turn(served, zmq, two, transcripts)
    four = [{"role": "system", "content": "Answer briefly."}, *two, *CONV_LATER[1:]]
    _conversation_turn(served, zmq, four, transcripts)


def _send_in_page(page: Any, turns: int) -> tuple[str, str, float]:
    """Click Send, wait until the history holds `turns` turns (or the page shows an error at
    once: no wait for the timeout then); (status, answer, the <audio> element's duration)."""
    page.click("#send")
    page.wait_for_function(
        f"document.querySelectorAll('#history .turn').length === {turns} || "
        "/^error/.test(document.getElementById('status').textContent)",
        timeout=600_000,
    )
    status, answer = page.inner_text("#status"), page.inner_text("#answer")
    assert status.startswith("done"), status
    duration = page.evaluate(
        """() => new Promise((resolve) => {
            const a = document.getElementById("player");
            if (a.readyState >= 1) resolve(a.duration); else a.onloadedmetadata = () => resolve(a.duration);
        })"""
    )
    return status, answer, duration


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium from the system packages (apt-get install chromium)")
def test_playground_page_streams_an_answer_in_a_real_browser(served: Served, zmq: OmniClient, tmp_path: Path) -> None:
    """The page at / in headless Chromium keeps a conversation: attach an audio file, send, the
    text appears, the audio plays as it streams and its <audio> element ends up with a playable
    WAV; the turn shows in the history; the next message goes with the whole history, the
    spoken answer by its audio id, and its answer is the pipeline's to that conversation."""
    sync_api = pytest.importorskip("playwright.sync_api")
    soundfile.write(tmp_path / "question.wav", tone(), 16_000, subtype="FLOAT")
    bodies: list[dict] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required"]
        )
        try:
            page = browser.new_page()
            page.on(
                "request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/chat/completions") else None
            )
            page.goto(f"{served.url}/")
            assert page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)") == ["Chelsie", "Ethan"]
            page.fill("#api-key", KEY)
            page.fill("#message", "What do you hear?")
            page.set_input_files("#audio-file", str(tmp_path / "question.wav"))
            page.select_option("#voice", "Ethan")
            status, answer, duration = _send_in_page(page, 2)
            assert (
                page.input_value("#message") == "" and page.eval_on_selector("#audio-file", "e => e.files.length") == 0
            )
            page.fill("#message", "And then?")
            _, answer2, duration2 = _send_in_page(page, 4)
            history = page.eval_on_selector_all("#history .turn", "ts => ts.map(t => t.textContent)")
        finally:
            browser.close()
    assert "first audio after" in status
    # The page sends the attachment, then the text (the model's own order), spoken.
    prompt = omni_prompt_text("What do you hear?", n_audio=1, system=SPEECH_SYSTEM_PROMPT)
    want = zmq.generate(prompt, chat_formatted=True, audios=[(tone(), 16_000)], speaker="Ethan", deadline_s=600)
    assert answer == _text(want)
    assert duration == pytest.approx(_audio(want).size / 24_000, abs=1e-3)
    # The second turn: the first one's messages, its answer by its audio id, then the new text.
    first, second = bodies
    (user1,) = first["messages"]
    assert [p["type"] for p in user1["content"]] == ["input_audio", "text"]
    assert second["messages"][0] == user1 and second["messages"][2] == {"role": "user", "content": [
        {"type": "text", "text": "And then?"}]}  # fmt: skip
    assert second["messages"][1]["role"] == "assistant" and second["messages"][1]["audio"]["id"].startswith("audio_")
    assert len(second["messages"]) == 3
    followed = prompt + f"{_text(want)}<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
    want2 = zmq.generate(followed, chat_formatted=True, audios=[(tone(), 16_000)], speaker="Ethan", deadline_s=600)
    assert answer2 == _text(want2)
    assert duration2 == pytest.approx(_audio(want2).size / 24_000, abs=1e-3)
    assert history == [
        "You[audio] What do you hear?", f"Model{_text(want)} (spoken)", "YouAnd then?", f"Model{_text(want2)} (spoken)"
    ]  # fmt: skip


def test_health_names_a_killed_stage_until_it_restarts(served: Served, zmq: OmniClient) -> None:
    """Last (it restarts token2wav): /health is 503 naming the stage while it (or the stage
    that feeds it, until relinked) is not serving, and 200 after its restart; a request
    meanwhile fails with a 5xx naming the stage, and the server keeps serving."""
    pid = next(s.pid for s in zmq.status().stages if s.stage_id == 2)
    os.kill(pid, signal.SIGKILL)
    saw_503 = saw_5xx = False
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        r = httpx.get(f"{served.url}/health", timeout=30)
        if r.status_code == 503:
            # the killed stage, or its upstream while it is not ready
            assert re.search(r"stage [12] \((down, restarting|not ready)\)", r.json()["reason"]), r.json()
            saw_503 = True
            if not saw_5xx:
                body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
                got = httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=_auth(), timeout=600)
                if got.status_code >= 500:  # (unless the stage came back meanwhile)
                    err = got.json()["error"]
                    assert re.search(r"stage", err["message"]) and err["type"] == "server_error", err
                    saw_5xx = True
        elif saw_503:
            break
        time.sleep(0.2)
    assert saw_503 and saw_5xx and r.status_code == 200
    assert next(s.restarts for s in zmq.status().stages if s.stage_id == 2) == 1
    assert served.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}]).choices


# ---- several server processes (http.workers) ----------------------------------------------------


def _workers_server(served: Served, port: int) -> subprocess.Popen[bytes]:
    """A second front on the served pipeline: `python -m omni_mp.http --workers 2`."""
    cmd = [sys.executable, "-m", "omni_mp.http", "--config", str(served.config), "--endpoint", served.pipeline.endpoint]
    cmd += ["--listen", f"127.0.0.1:{port}", "--workers", "2"]
    return subprocess.Popen(cmd, env=dict(os.environ, OMNI_MP_API_KEY=KEY), cwd=Path(__file__).resolve().parents[1])


def _clients_on_two_workers(url: str) -> tuple[httpx.Client, httpx.Client, list[httpx.Client]]:
    """Keep-alive clients, opened until two of them talk to different workers (/health says which)."""
    opened: list[httpx.Client] = []
    by_pid: dict[int, httpx.Client] = {}
    deadline = time.monotonic() + 120
    while len(by_pid) < 2:
        assert time.monotonic() < deadline and len(opened) < 200, f"one worker answers every connection: {by_pid}"
        client = httpx.Client(base_url=url, headers=_auth(), timeout=600)
        opened.append(client)
        try:
            reply = client.get("/health")
        except httpx.TransportError:
            time.sleep(0.5)
            continue
        if reply.status_code == 200:
            by_pid.setdefault(reply.json()["worker_pid"], client)
    a, b = by_pid.values()
    return a, b, opened


def _workers_of(supervisor: psutil.Process) -> list[psutil.Process]:
    """uvicorn's worker processes (spawned: multiprocessing's spawn_main), not its resource tracker."""
    out = []
    for p in supervisor.children():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:  # a worker just killed (the test's own kill -9) is gone or a zombie
            continue
    return out


def _chat_outcomes(client: httpx.Client) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            if s.name == "omni_mp_http_requests_total" and s.labels["endpoint"] == "chat":
                out[s.labels["code"]] = out.get(s.labels["code"], 0) + s.value
    return out


def test_two_workers_share_audio_ids_and_metrics_and_leave_nothing(served: Served) -> None:
    """An answer spoken by one worker continues on another by its audio id (the same prompt as
    the one-process server given the transcript), an id the store never issued is a 400 on any
    worker, /metrics on either counts both, a killed worker is replaced while the other serves,
    and SIGTERM ends every worker and removes the server's private directory."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _workers_server(served, port)
    try:
        a, b, opened = _clients_on_two_workers(url)
        before = _chat_outcomes(a)
        first = [{"role": "user", "content": "Say something about the sea."}]
        oa = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, http_client=a, max_retries=0)
        ob = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, http_client=b, max_retries=0)
        spoken = oa.chat.completions.create(
            model="tiny", messages=first, modalities=["text", "audio"], audio={"voice": "Chelsie", "format": "wav"},
            max_completion_tokens=8, seed=3,
        )  # fmt: skip
        audio = spoken.choices[0].message.audio
        assert audio is not None and audio.transcript
        follow = [*first, {"role": "assistant", "audio": {"id": audio.id}}, {"role": "user", "content": "And then?"}]
        got = ob.chat.completions.create(model="tiny", messages=follow, max_completion_tokens=8)
        as_text = [*first, {"role": "assistant", "content": audio.transcript}, {"role": "user", "content": "And then?"}]
        want = served.openai.chat.completions.create(model="tiny", messages=as_text, max_completion_tokens=8)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.usage is not None and want.usage is not None
        assert got.usage.prompt_tokens == want.usage.prompt_tokens
        never = audio.id[:-4] + ("0000" if not audio.id.endswith("0000") else "1111")
        with pytest.raises(openai.BadRequestError, match="unknown audio id"):
            ob.chat.completions.create(model="tiny", messages=[*first, {"role": "assistant", "audio": {"id": never}}])
        after = _chat_outcomes(b)
        assert after.get("ok", 0) - before.get("ok", 0) == 2
        assert after.get("audio_id_unknown", 0) - before.get("audio_id_unknown", 0) == 1

        supervisor = psutil.Process(proc.pid)
        workers = _workers_of(supervisor)
        assert len(workers) == 2
        spec = json.loads(workers[0].environ()["OMNI_MP_HTTP_WORKER"])
        shared = Path(spec["settings"]["shared_store"]["path"]).parent
        assert shared.is_dir() and oct(shared.stat().st_mode & 0o777) == "0o700"
        pid_b = b.get("/health").json()["worker_pid"]
        psutil.Process(pid_b).kill()
        assert a.get("/health").status_code == 200  # the other worker serves on
        deadline = time.monotonic() + 120
        while {p.pid for p in _workers_of(supervisor)} & {pid_b} or len(_workers_of(supervisor)) < 2:
            assert time.monotonic() < deadline, "uvicorn did not replace the killed worker"
            time.sleep(0.5)
        for client in opened:
            client.close()
        workers = supervisor.children()  # the workers and multiprocessing's resource tracker
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        # The resource tracker ends when it reads its parent's pipe closed: shortly after, not before.
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
        assert not shared.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_pipecat_openai_llm_service_holds_a_conversation(served: Served, tmp_path: Path) -> None:
    """pipecat's OpenAILLMService with its context aggregators, as a pipecat bot runs it: a
    system prompt, a first turn, then a second user message once the first answer is in the
    context. Each answer it streams is the server's answer to the same message list."""
    system, first, second = "You are a terse assistant.", "Name a colour.", "And another one?"
    got = client_script("pipecat_llm", f"{served.url}/v1", KEY, system, first, second, str(tmp_path / "llm.json"))
    assert got["errors"] == [] and len(got["answers"]) == 2
    context = got["messages"]  # what pipecat sent: its context (it strips the answers it stores)
    assert [m["role"] for m in context] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in context][:2] == [system, first] and context[3]["content"] == second
    for k, answer in enumerate(got["answers"]):
        want = served.openai.chat.completions.create(model="omni", messages=context[: 2 + 2 * k])
        assert answer == want.choices[0].message.content and answer.strip()
        assert context[2 + 2 * k]["content"] == answer.strip()


def test_text_answers_read_the_thinkers_prefix_cache_and_spoken_ones_compute_every_row(served: Served) -> None:
    """With the thinker's prefix cache on, a text-only answer (no talker runs: nobody reads the
    thinker's hidden rows) starts from the cached prefix of an earlier turn and says the same;
    a spoken answer reads none of it (the talker needs every prompt row), and speaks as before."""
    system = "You are a helpful assistant who answers briefly. " * 6
    turn = [{"role": "system", "content": system}, {"role": "user", "content": "What is the sea?"}]

    def ask(**kw: Any) -> Any:
        return served.openai.chat.completions.create(model="tiny", messages=turn, max_completion_tokens=8, **kw)

    first, again = ask(), ask()
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 16 <= cached < again.usage.prompt_tokens and cached % 16 == 0, cached
    assert again.choices[0].message.content == first.choices[0].message.content
    spoken = [ask(modalities=["text", "audio"], audio={"voice": "Chelsie", "format": "wav"}, seed=5) for _ in range(2)]
    for answer in spoken:
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        assert answer.usage.prompt_tokens_details.cached_tokens == 0
    assert spoken[0].choices[0].message.audio.data == spoken[1].choices[0].message.audio.data  # type: ignore[union-attr]

"""`POST /v1/audio/transcriptions` end to end (issue 47, item 5): a real launcher with `--http`
on the tiny Qwen2.5-Omni and Qwen3-Omni pipelines (one at a time, CPU), driven by the official
`openai` client. The checkpoints have random weights, so the words mean nothing: the transcript
must equal the thinker's greedy answer to the same prompt and audio through our ZMQ client,
and the usage its token counts; the prompt is checked against the family's documented one."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile

from omni_mp.client.omni_client import OmniClient
from omni_mp.config.validate import load_config
from omni_mp.http.detok import load_tokenizer
from omni_mp.http.pipeline import PipelineView
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished
from tests.launcher import ServedPipeline, settled_client
from tests.shared_servers import KEY
from tests.synthetic_media import tone

pytestmark = pytest.mark.engine

QWEN25_SYSTEM = "You are a speech recognition model."
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Served:
    name: str
    pipeline: ServedPipeline
    url: str
    view: PipelineView
    tokenizer: Any
    openai: openai.OpenAI


@pytest.fixture(scope="module", params=["tiny_qwen2_5_omni", "tiny_qwen3_omni"])
def served(
    request: pytest.FixtureRequest,
    shared_tiny_qwen2_5_omni: tuple[ServedPipeline, str],
    shared_tiny_qwen3_omni: tuple[ServedPipeline, str],
) -> Served:
    """The shipped tiny config's shared server (tests/shared_servers.py)."""
    config = CONFIG_DIR / f"{request.param}.yaml"
    pipeline, url = {"tiny_qwen2_5_omni": shared_tiny_qwen2_5_omni, "tiny_qwen3_omni": shared_tiny_qwen3_omni}[
        request.param
    ]
    view = PipelineView.of(load_config(config))
    assert view.text_stage is not None
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)
    return Served(request.param, pipeline, url, view, load_tokenizer(view.text_stage.model), api)


@pytest.fixture
def zmq(served: Served) -> Iterator[OmniClient]:
    with settled_client(served.pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


# ---- files, each made (and read back, for the oracle) by the library the server reads it with


def _soundfile(fmt: str, subtype: str | None = None) -> Callable[[np.ndarray, int], bytes]:
    def make(samples: np.ndarray, rate: int) -> bytes:
        buf = io.BytesIO()
        soundfile.write(buf, samples, rate, format=fmt, subtype=subtype)
        return buf.getvalue()

    return make


def _pyav(container: str, codec: str, rate: int) -> Callable[[np.ndarray, int], bytes]:
    def make(samples: np.ndarray, in_rate: int) -> bytes:
        buf = io.BytesIO()
        with av.open(buf, mode="w", format=container) as out:
            stream = out.add_stream(codec, rate=rate, layout="mono")
            frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
            frame.sample_rate = in_rate
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                out.mux(packet)
        return buf.getvalue()

    return make


def _read_soundfile(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def _read_pyav(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as f:
        frames = [fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)]  # mono float planar
        rate = f.streams.audio[0].rate
    return np.concatenate(frames).astype(np.float32), rate


FORMATS: dict[str, tuple[Callable[[np.ndarray, int], bytes], Callable[[bytes], tuple[np.ndarray, int]]]] = {
    "wav": (_soundfile("WAV", "FLOAT"), _read_soundfile),
    "flac": (_soundfile("FLAC"), _read_soundfile),
    "mp3": (_soundfile("MP3"), _read_soundfile),
    "ogg": (_soundfile("OGG", "VORBIS"), _read_soundfile),
    "m4a": (_pyav("ipod", "aac", 16_000), _read_pyav),
    "webm": (_pyav("webm", "libopus", 48_000), _read_pyav),
}


@dataclass
class Answer:
    text: str
    prompt_ids: list[int]
    output_tokens: int


def _oracle(served: Served, zmq: OmniClient, text: str, audio: tuple[np.ndarray, int]) -> Answer:
    """The thinker's greedy answer through the ZMQ client, with the family's documented prompt
    (Qwen2.5-Omni's recognition system turn; none for Qwen3-Omni)."""
    assert served.view.text_stage is not None
    stage = served.view.text_stage.id
    params = {"system_prompt": QWEN25_SYSTEM} if served.name == "tiny_qwen2_5_omni" else None
    prompt_ids: list[int] = []
    n, done = 0, None
    for ev in zmq.stream(text, audios=[audio], params=params, final_stages=[stage], deadline_s=600):
        if isinstance(ev, Finished):
            done = ev
        elif ev.stage_id == stage:
            prompt_ids = list(ev.prompt_token_ids) if ev.prompt_token_ids else prompt_ids
            n += len(ev.token_ids)
    assert done is not None
    rendered = served.tokenizer.decode(prompt_ids)
    assert f"{text}<|im_end|>\n<|im_start|>assistant\n" in rendered
    if served.name == "tiny_qwen2_5_omni":
        assert rendered.startswith(f"<|im_start|>system\n{QWEN25_SYSTEM}<|im_end|>\n<|im_start|>user\n<|audio_bos|>")
    else:
        assert rendered.startswith("<|im_start|>user\n<|audio_start|>")  # no system turn
    return Answer(next(o.text for o in done.outputs if o.stage_id == stage), prompt_ids, n)


def _audio_token(served: Served) -> int:
    return served.tokenizer.convert_tokens_to_ids(
        "<|AUDIO|>" if served.name == "tiny_qwen2_5_omni" else "<|audio_pad|>"
    )


def _assert_usage(served: Served, usage: Any, want: Answer) -> None:
    audio = sum(1 for t in want.prompt_ids if t == _audio_token(served))
    assert audio > 0
    assert usage.type == "tokens"
    assert (usage.input_tokens, usage.output_tokens) == (len(want.prompt_ids), want.output_tokens)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_token_details.audio_tokens == audio
    assert usage.input_token_details.text_tokens == len(want.prompt_ids) - audio


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_transcribes_as_the_thinker_answers(served: Served, zmq: OmniClient, fmt: str) -> None:
    make, read = FORMATS[fmt]
    data = make(tone(1.5), 16_000)
    got = served.openai.audio.transcriptions.create(file=(f"speech.{fmt}", data), model=served.name)
    want = _oracle(served, zmq, "Transcribe the audio into text.", read(data))
    assert want.text and got.text == want.text
    _assert_usage(served, got.usage, want)


def test_text_format_language_prompt_and_chunking_auto(served: Served, zmq: OmniClient) -> None:
    wav = FORMATS["flac"][0](tone(2.0, 24_000), 24_000)
    got = served.openai.audio.transcriptions.create(
        file=("a.flac", wav), model=served.name, response_format="text", language="fr",
        prompt="Noms : Ada, Grace.", chunking_strategy="auto", temperature=0.0,
    )  # fmt: skip
    want = _oracle(served, zmq, "Transcribe the French audio into text.\nNoms : Ada, Grace.", _read_soundfile(wav))
    assert got == want.text  # the body is the transcript itself
    chinese = served.openai.audio.transcriptions.create(file=("a.flac", wav), model=served.name, language="zh")
    assert chinese.text == _oracle(served, zmq, "请将这段中文语音转换为纯文本。", _read_soundfile(wav)).text


def test_stream_sends_deltas_then_done_with_usage(served: Served, zmq: OmniClient) -> None:
    wav = FORMATS["wav"][0](tone(1.0), 16_000)
    events = list(
        served.openai.audio.transcriptions.create(file=("a.wav", wav), model=served.name, stream=True, languages=["en"])
    )
    want = _oracle(served, zmq, "Transcribe the English audio into text.", _read_soundfile(wav))
    *deltas, done = events
    assert [e.type for e in deltas] == ["transcript.text.delta"] * len(deltas) and done.type == "transcript.text.done"
    assert len(deltas) >= 2 and all(e.delta for e in deltas)  # written as it comes, not in one piece
    assert "".join(e.delta for e in deltas) == done.text == want.text
    _assert_usage(served, done.usage, want)


def _post(served: Served, headers: dict[str, str] = AUTH, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/audio/transcriptions", headers=headers, timeout=60, **kwargs)


def _refused(call: Callable[[], Any], param: str | None, *words: str) -> None:
    with pytest.raises(openai.BadRequestError) as got:
        call()
    err = got.value
    assert err.status_code == 400 and err.param == param, (err.param, err.message)
    for word in words:
        assert word in err.message, err.message


def test_bad_input_is_a_400_naming_it(served: Served, zmq: OmniClient) -> None:
    create = served.openai.audio.transcriptions.create
    wav = FORMATS["wav"][0](tone(0.5), 16_000)
    m = served.name

    def with_(**kw: Any) -> Callable[[], Any]:
        return lambda: create(**{"file": ("a.wav", wav), "model": m, **kw})

    _refused(lambda: create(file=("a.wav", b""), model=m), "file", "empty")
    _refused(lambda: create(file=("a.wav", b"this is not audio " * 20), model=m), "file", "not an audio file")
    m4a = FORMATS["m4a"][0](tone(0.5), 16_000)
    _refused(lambda: create(file=("a.m4a", m4a[: len(m4a) // 3]), model=m), "file")  # a cut-off file
    limit = served.view.media_limits.max_audio_s
    assert limit is not None
    long = FORMATS["flac"][0](tone(limit + 1.0, 4_000), 4_000)
    _refused(lambda: create(file=("long.flac", long), model=m), "file", f"max_audio_s={limit:g}")
    _refused(with_(response_format="srt"), "response_format", "['json', 'text']")
    _refused(with_(response_format="verbose_json", timestamp_granularities=["word"]), "timestamp_granularities")
    _refused(with_(include=["logprobs"]), "include", "log probabilities")
    _refused(with_(chunking_strategy={"type": "server_vad", "threshold": 0.5}), "chunking_strategy", "one block")
    _refused(with_(known_speaker_names=["a"], known_speaker_references=["data:audio/wav;base64,AA=="]),
             "known_speaker_names", "diarization")  # fmt: skip
    _refused(with_(keywords=["Ada"]), "keywords", "prompt")
    _refused(with_(language="xx"), "language", "'en'")
    _refused(with_(languages=["en", "fr"]), "languages", "one language")
    _refused(with_(temperature=1.5), "temperature")
    _refused(with_(extra_body={"beam_size": 5}), "beam_size", "unknown field")
    # What the SDK never sends (raw HTTP): not multipart, no file, a file that is a text field.
    got = _post(served, json={"model": m, "file": "a.wav"})
    assert got.status_code == 400 and got.json()["error"]["param"] == "content-type"
    got = _post(served, files={"model": (None, m)})
    assert got.status_code == 400 and got.json()["error"]["param"] == "file"
    got = _post(served, files={"model": (None, m), "file": (None, "a.wav")})
    assert got.status_code == 400 and got.json()["error"]["param"] == "file"
    got = _post(served, files={"file": ("a.wav", wav)})
    assert got.status_code == 400 and got.json()["error"]["param"] == "model"
    got = _post(served, headers={}, files={"file": ("a.wav", wav), "model": (None, m)})
    assert got.status_code == 401 and got.json()["error"]["code"] == "invalid_api_key"
    # curl's form (`-F include=...` without brackets) reads as the SDK's does.
    got = _post(served, files={"file": ("a.wav", wav), "model": (None, m), "include": (None, "logprobs")})
    assert got.status_code == 400 and got.json()["error"]["param"] == "include"
    # Nothing else is affected: the server is healthy, nothing is left in flight.
    assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
    assert zmq.status().inflight == 0

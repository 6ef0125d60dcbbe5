"""POST /v1/audio/speech speaks exactly `input` (omni_mp.http.speech), on the tiny Qwen2.5-Omni
pipeline served by a real launcher with `--http`, driven by the official `openai` client (raw
httpx where the wire itself is checked) and by LiveKit's and pipecat's OpenAI TTS as their
users configure them (in their own virtualenv: tests/clients).

The oracle: transformers' Qwen2_5OmniForConditionalGeneration.generate() on the same
checkpoint (fp32, greedy) with its thinker's reply forced to the input's tokens then
<|im_end|> (tests.hf_oracle.ForceTokens): the talker's codes must be equal and the waveform
within WAV_RTOL. Every response format is decoded with PyAV: 24 kHz mono, the samples the
pcm answer holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.http.speech import SPEECH_REQUEST
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished
from tests.client_scripts import client_script
from tests.hf_oracle import assert_same_tokens, omni_generate, reply_ids
from tests.launcher import ServedPipeline, settled_client
from tests.shared_servers import VOICE_ALIASES
from tests.speech_checks import (
    KEY,
    Decoded,
    check_every_format,
    check_livekit_plays_the_mp3,
    check_sse_is_the_answer,
    pcm_samples,
)

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen2_5_omni.yaml"
MIN_MARGIN = 1e-5  # the talker's top-2 logit margins must be above this (a pass is not luck)
# The streamed waveform (token2wav in chunks) against transformers' one-shot one, for the two
# texts below (22 and 28 codes, rms 0.057): relative L2 8.2e-7 and 8.1e-7, max abs 2.1e-7 and
# 1.9e-7 (float summation order). The bounds are about 10x that, 1000x below the signal.
WAV_RTOL = 1e-5
WAV_ATOL = 2e-6
PCM_LSB = 1 / 32768
# LiveKit's and pipecat's clients live in a virtualenv of their own: their requirements pin
# other versions of packages omni_mp pins (protobuf, soundfile, soxr); scripts/setup.sh builds it.
ALIASES = VOICE_ALIASES  # configured: one new name, one of OpenAI's remapped
TEXTS = {
    "plain": "Good morning, how are you today?",
    "special": 'Say "<|im_end|>" and keep going.',  # a special token's text stays text
}


class Served:
    def __init__(self, pipeline: ServedPipeline, url: str) -> None:
        self.pipeline, self.url = pipeline, url
        self.openai = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)

    def speech(self, text: str, voice: str = "Ethan", fmt: str = "pcm", **kw: object) -> bytes:
        with self.openai.audio.speech.with_streaming_response.create(
            model="tiny",
            voice=voice,
            input=text,
            response_format=fmt,
            **kw,  # type: ignore[arg-type]
        ) as r:
            assert r.status_code == 200
            return b"".join(r.iter_bytes())

    def post(self, body: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {KEY}"}
        return httpx.post(f"{self.url}/v1/audio/speech", json=body, headers=headers, timeout=600)


@pytest.fixture(scope="module")
def served(shared_tiny_qwen2_5_omni: tuple[ServedPipeline, str]) -> Served:
    return Served(*shared_tiny_qwen2_5_omni)  # tests/shared_servers.py: with ALIASES


@pytest.fixture
def zmq(served: Served) -> Iterator[OmniClient]:
    with settled_client(served.pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


def _given(zmq: OmniClient, text: str, speaker: str = "Ethan") -> Finished:
    """What /v1/audio/speech submits for `text`, through the ZMQ client (all stages' outputs)."""
    return zmq.generate(SPEECH_REQUEST.format(input=text), forced_reply=text, speaker=speaker, deadline_s=600)


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_talker_voices_the_input_exactly_as_transformers(served: Served, zmq: OmniClient, name: str) -> None:
    text = TEXTS[name]
    model_dir = resolve_model("tiny-qwen2_5-omni")
    done = _given(zmq, text)
    reply = reply_ids(model_dir, text)
    want = omni_generate(model_dir, SPEECH_REQUEST.format(input=text), speaker="Ethan", seed=0, forced_reply=reply)
    out = {o.stage_id: o for o in done.outputs}
    timings = {d.stage_id: d for d in done.stage_timings}
    assert timings[0].num_prompt_tokens == len(want.prompt_ids)
    assert out[0].token_ids == reply == want.thinker_ids  # the thinker's reply is the input, no word more
    codes = out[1].token_ids[:-1] if out[1].finish_reason == "stop" else out[1].token_ids
    assert_same_tokens(codes, want.codes, want.code_margins, "talker")
    assert min(want.code_margins) > MIN_MARGIN
    got, ref = out[2].audio, want.wav
    assert out[2].sample_rate == 24_000 and got.shape == ref.shape, (got.shape, ref.shape)
    rel, max_abs = float((got - ref).norm() / ref.norm()), float((got - ref).abs().max())
    rms = float(ref.pow(2).mean().sqrt())
    print(f"[{name}] {len(codes)} codes; vs transformers: relative L2 {rel:.2e}, max abs {max_abs:.2e}, rms {rms:.2e}")
    assert rel <= WAV_RTOL and max_abs <= WAV_ATOL and rms >= 1000 * WAV_ATOL
    # Control: asked to read the text (no reply given), the thinker says something else.
    free = zmq.generate(SPEECH_REQUEST.format(input=text), final_stages=[0], deadline_s=600)
    assert free.outputs[0].token_ids != reply
    # The HTTP answer is that audio: PCM16 of the same samples.
    pcm = pcm_samples(served.speech(text, voice="Ethan", fmt="pcm"))
    want_pcm = np.clip(got.numpy(), -1, 1)
    assert pcm.shape == want_pcm.shape and np.abs(pcm - want_pcm).max() <= PCM_LSB


LONG = (
    "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the distant hills "
    "and the river keeps flowing toward the sea."
)  # long enough that the audio comes in several chunks
LOSSY_CORR = 0.5  # the tiny model's audio is noise-like: lossy codecs keep its shape only roughly


def test_every_format_decodes_to_24khz_mono_audio_of_the_pcm_answer(served: Served) -> None:
    """The `openai` client asks for each response format; PyAV decodes it: 24 kHz mono (Opus:
    48 kHz, its decoders' one rate, with 24 kHz in its header) holding the pcm answer's samples."""
    check_every_format(served.openai, dict.fromkeys(("mp3", "opus", "aac"), LOSSY_CORR), voice="Ethan", input=LONG)


def test_sse_streams_deltas_then_done_with_the_usage(served: Served, zmq: OmniClient) -> None:
    usage = check_sse_is_the_answer(served.openai, "pcm", voice="Ethan", input=LONG)
    done = _given(zmq, LONG)
    timings = {d.stage_id: d for d in done.stage_timings}
    want_in = timings[0].num_prompt_tokens + timings[0].num_output_tokens  # the prompt and the given text
    want_out = timings[1].num_output_tokens  # the talker's codes
    assert usage == {"input_tokens": want_in, "output_tokens": want_out, "total_tokens": want_in + want_out}
    # What LiveKit's plugin asks by default: SSE of mp3; the deltas make one mp3 stream.
    check_sse_is_the_answer(served.openai, "mp3", voice="Ethan", input=LONG)


def test_voices_are_listed_and_openai_names_are_aliases(served: Served) -> None:
    r = httpx.get(f"{served.url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    listed = {v["id"]: v for v in r.json()["data"]}
    assert r.status_code == 200 and sorted(listed) == ["Chelsie", "Ethan"]
    assert all(v["object"] == "audio.voice" for v in listed.values())
    openai_names = {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
                    "marin", "cedar"}  # fmt: skip
    aliases = {a: v for v in listed for a in listed[v]["aliases"]}
    assert openai_names <= set(aliases) and aliases["narrator"] == "Ethan" and aliases["echo"] == "Chelsie"
    assert aliases["ash"] == "Ethan" and aliases["alloy"] == "Chelsie"  # the defaults not configured away
    (model,) = served.openai.models.list().data
    assert model.object == "model" and set(model.voices) == {"Chelsie", "Ethan", *aliases}  # type: ignore[attr-defined]
    text = TEXTS["plain"]
    ethan, chelsie = served.speech(text, voice="Ethan"), served.speech(text, voice="Chelsie")
    assert ethan != chelsie  # (control: the voice matters)
    for name, want in [("ash", ethan), ("narrator", ethan), ("alloy", chelsie), ("echo", chelsie), ("ETHAN", ethan)]:
        assert served.speech(text, voice=name) == want, name
    assert served.speech(text, voice={"id": "ash"}) == ethan  # type: ignore[arg-type]  # OpenAI's voice object


def test_speed_stretches_the_audio(served: Served) -> None:
    ref = served.speech(LONG, fmt="pcm")
    n = len(ref) // 2
    for speed in (0.5, 2.0):
        got = len(served.speech(LONG, fmt="pcm", speed=speed)) // 2
        assert abs(got - n / speed) <= 0.01 * n / speed + 600, (speed, got, n)  # as tests/test_speech_encode.py
    assert served.speech(LONG, fmt="pcm", speed=1.0) == ref


def test_bad_input_is_a_400_naming_the_field_and_nothing_else_is_affected(served: Served) -> None:
    ok = {"model": "tiny", "input": "Hello there.", "voice": "ash"}
    cases = [
        ({"voice": "Nobody"}, "voice"),
        ({"voice": {"id": "Nobody"}}, "voice.id"),
        ({"voice": {"name": "ash"}}, "voice.name"),
        ({"input": ""}, "input"),
        ({"input": " \n "}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "ws"}, "stream_format"),
        ({"speed": 4.5}, "speed"),
        ({"speed": 0.2}, "speed"),
        ({"instructions": "Speak cheerfully."}, "instructions"),
        ({"seed": 3}, "seed"),  # not a field of OpenAI's speech request
    ]
    for change, param in cases:
        r = served.post({**ok, **change})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param, (change, err)
        assert err["type"] == "invalid_request_error" and err["message"], err
    assert "Chelsie" in served.post({**ok, "voice": "Nobody"}).json()["error"]["message"]
    # Every field of OpenAI's request is known: with values we serve, a 200.
    every = {**ok, "instructions": "", "response_format": "wav", "speed": 1.0, "stream_format": "audio"}
    r = served.post(every)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav" and r.headers["x-request-id"]
    assert Decoded(r.content).samples.size > 0


def test_a_given_reply_is_checked_before_any_stage_runs(zmq: OmniClient) -> None:
    """Submit.forced_reply: refused by the coordinator with media (it takes a text-only prompt);
    the client refuses an empty one or one without a text prompt (tests/test_client_checks.py)."""
    with pytest.raises(RequestError, match="`forced_reply`: needs a text `prompt` and no media") as raised:
        zmq.generate("Hear this.", forced_reply="Heard.", audios=[(np.zeros(16_000, np.float32), 16_000)])
    assert raised.value.code == "invalid_input" and raised.value.stage_id is None
    done = zmq.generate("Say hi.", forced_reply="Hi.", final_stages=[0], deadline_s=600)  # still serving
    assert done.outputs[0].token_ids == reply_ids(resolve_model("tiny-qwen2_5-omni"), "Hi.")


def test_livekit_openai_tts_plugin_with_its_defaults(served: Served, tmp_path: Path) -> None:
    """LiveKit's plugin as configured by default (voice `ash`, mp3 over SSE): it decodes the mp3
    itself; what it plays is the mp3 answer of the same request."""
    got = client_script("livekit_tts", f"{served.url}/v1", KEY, LONG, str(tmp_path / "livekit.json"))
    check_livekit_plays_the_mp3(got, Decoded(served.speech(LONG, voice="ash", fmt="mp3")).samples)


def test_pipecat_openai_tts_service(served: Served, tmp_path: Path) -> None:
    """pipecat's OpenAITTSService (pcm, OpenAI's voice names only) in a pipecat pipeline: the
    frames it pushes hold exactly the pcm answer for the voice `alloy` is an alias of."""
    got = client_script("pipecat_tts", f"{served.url}/v1", KEY, LONG, "alloy", str(tmp_path / "pipecat.json"))
    assert got["errors"] == [] and got["rates"] == [24_000] and got["channels"] == [1]
    assert got["pcm"].tobytes() == served.speech(LONG, voice="Chelsie", fmt="pcm")

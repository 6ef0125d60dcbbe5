"""POST /v1/audio/speech on the tiny Qwen3-TTS pipeline (omni_mp/stage_configs/tiny_qwen3_tts.yaml:
the talker, its prompt from `input`, `voice` and `instructions`; the streaming codec decoder),
served by a real launcher with `--http`, through the `openai` SDK: the PCM answer is the qwen-tts
0.1.1 reference's waveform for the same text, preset voice and instructions (its own venv; fp32,
greedy, repetition penalty 1.05 as the YAML) within WAV_ATOL plus PCM16 rounding, in the whole-text
prompt mode (the default) and the text-streaming one (vllm-omni's `non_streaming_mode: false`);
every response format decodes to the pcm answer and SSE carries it; the preset voices are the
model's voices (GET /v1/audio/voices); the chat endpoint answers 400 for this family, and a bad
voice a 400 naming it; LiveKit's OpenAI TTS plugin plays the mp3 answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from omni_mp.client.omni_client import OmniClient
from omni_mp.models.registry import resolve_model
from tests import speech_checks as checks
from tests.client_scripts import client_script
from tests.launcher import ServedPipeline, settled_client
from tests.qwen3_tts_oracle import OracleRun, require_reference, run_reference
from tests.shared_servers import TTS_MAX_TOKENS
from tests.speech_checks import KEY, Decoded, check_livekit_plays_the_mp3, pcm_samples

pytestmark = pytest.mark.engine

FRAMES = TTS_MAX_TOKENS  # the talker's max_tokens here (a shorter answer than the YAML's 256): 23 frames
WAV_ATOL = 2e-4 + 1 / 32768  # streamed vs one-shot (tests/test_qwen3_tts_codec.py) and PCM16's step


@pytest.fixture(scope="module")
def served(shared_tiny_qwen3_tts: tuple[ServedPipeline, str]) -> tuple[ServedPipeline, str]:
    require_reference()
    return shared_tiny_qwen3_tts  # tests/shared_servers.py: its talker's max_tokens is FRAMES


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)


TEXT, VOICE, INSTRUCTIONS = "hello there, how are you?", "vivian", "speak slowly and warmly"
MODES = {"default": {}, "text-streamed": {"non_streaming_mode": False}}  # vllm-omni's field, as sent


@pytest.fixture(scope="module")
def reference() -> OracleRun:
    """The reference's waveform of TEXT in each mode (its generate's non_streaming_mode: True, the
    generate_custom_voice default, and False)."""
    req = {"kind": "custom_voice", "text": TEXT, "speaker": VOICE, "language": "auto", "instruct": INSTRUCTIONS,
           "max_new_tokens": FRAMES, "repetition_penalty": 1.05}  # fmt: skip
    run = run_reference(resolve_model("tiny-qwen3-tts-custom-voice"), [req | mode for mode in MODES.values()])
    assert run.report["errors"] == {}
    return run


@pytest.mark.parametrize("mode", list(MODES))
def test_speech_equals_the_reference(served: tuple[ServedPipeline, str], reference: OracleRun, mode: str) -> None:
    with _client(served[1]).audio.speech.with_streaming_response.create(
        model="tiny", voice=VOICE, input=TEXT, instructions=INSTRUCTIONS, response_format="pcm",
        extra_body=MODES[mode] or None,
    ) as r:  # fmt: skip
        got = pcm_samples(b"".join(r.iter_bytes()))
    want = reference.wavs[list(MODES).index(mode)]
    assert float(np.sqrt(np.mean(want**2))) > 0.03
    assert got.shape == want.shape, (got.shape, want.shape)
    assert float(np.abs(got - want).max()) <= WAV_ATOL


def test_the_two_text_modes_differ(reference: OracleRun) -> None:
    """The mode reaches the audio: the comparisons above can tell them apart."""
    a, b = reference.wavs
    assert a.shape != b.shape or float(np.abs(a - b).max()) > 0.01


def test_voices_are_the_presets_and_bad_ones_are_named(served: tuple[ServedPipeline, str]) -> None:
    url = served[1]
    listed = httpx.get(f"{url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert sorted(v["id"] for v in listed["data"]) == ["dylan", "ryan", "vivian"]
    with pytest.raises(openai.BadRequestError, match="unknown voice 'nobody'"):
        _client(url).audio.speech.create(model="tiny", voice="nobody", input="hello", response_format="pcm")


def test_chat_answers_400_for_this_family(served: tuple[ServedPipeline, str]) -> None:
    with pytest.raises(openai.BadRequestError, match=r"does not chat.*/v1/audio/speech"):
        _client(served[1]).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])


def test_cloning_fields_on_a_preset_voice_model_are_refused(served: tuple[ServedPipeline, str]) -> None:
    """A CustomVoice checkpoint clones nothing: each cloning field is a 400 naming it, before any
    audio is decoded (the clip here is not even audio); and the server goes on speaking."""
    client = _client(served[1])
    for extra, match in (
        ({"ref_audio": "data:audio/wav;base64,AAAA"}, r"\['ref_audio'\]: voice cloning needs a Base checkpoint"),
        ({"ref_text": "words", "x_vector_only_mode": True}, "needs a Base checkpoint; this model is CustomVoice"),
        ({"task_type": "Base"}, "task_type 'Base': this model is a CustomVoice checkpoint"),
    ):
        with pytest.raises(openai.BadRequestError, match=match):
            client.audio.speech.create(
                model="tiny", voice="vivian", input="hello", response_format="pcm", extra_body=extra
            )
    made = httpx.post(
        f"{served[1]}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"},
        files={"audio_sample": ("a.wav", b"RIFF", "audio/wav")}, data={"name": "x"},
    )  # fmt: skip
    assert made.status_code == 400 and "clones no voices" in made.text
    got = client.audio.speech.create(
        model="tiny", voice="vivian", input="hello", response_format="pcm", extra_body={"language": "english"}
    )
    assert len(got.content) > 0


def test_livekit_openai_tts_plugin_with_its_defaults(served: tuple[ServedPipeline, str], tmp_path: Path) -> None:
    """LiveKit Agents' OpenAI TTS plugin as configured by default (voice `ash`, an alias of a preset
    here; mp3 over SSE) in the clients' venv: what it plays is the mp3 answer of the same request."""
    text = "the quick brown fox jumps over the lazy dog"
    got = client_script("livekit_tts", f"{served[1]}/v1", KEY, text, str(tmp_path / "livekit.json"))
    mp3 = _client(served[1]).audio.speech.create(
        model="gpt-4o-mini-tts", voice="ash", input=text, response_format="mp3"
    )
    check_livekit_plays_the_mp3(got, Decoded(mp3.content).samples)


# The lossy codecs on this model's audio (TEXT, 23 frames, 1.84 s): correlation with the pcm answer
# past the codec's priming, measured mp3 0.985, opus 0.919, aac 0.960 (PyAV 18.1, libavcodec 62, at
# omni_mp.http.audio_encode's bit rates); the bounds leave room for other encoder builds.
LOSSY_MIN_CORR = {"mp3": 0.95, "opus": 0.85, "aac": 0.92}


def test_every_format_decodes_to_the_pcm_answer(served: tuple[ServedPipeline, str]) -> None:
    """wav, pcm, mp3, opus, aac and flac of one request (text-streamed, instructed): PyAV decodes
    each to the pcm answer's samples (tests/speech_checks.check_every_format)."""
    request = {"voice": VOICE, "input": TEXT, "instructions": INSTRUCTIONS, "extra_body": MODES["text-streamed"]}
    checks.check_every_format(_client(served[1]), LOSSY_MIN_CORR, **request)


@pytest.fixture
def zmq(served: tuple[ServedPipeline, str]) -> Iterator[OmniClient]:
    with settled_client(served[0].endpoint) as c:
        yield c  # type: ignore[misc]


def test_sse_deltas_are_the_answer_and_done_has_the_usage(served: tuple[ServedPipeline, str], zmq: OmniClient) -> None:
    """`stream_format: "sse"`: `speech.audio.delta` events whose bytes are the pcm (and the mp3)
    answer, then `speech.audio.done` with the talker's prompt rows in and its steps out, as the
    same request through the ZMQ client counts them."""
    client = _client(served[1])
    request = {"voice": VOICE, "input": TEXT, "extra_body": MODES["text-streamed"]}
    usage = checks.check_sse_is_the_answer(client, "pcm", **request)
    done = zmq.generate(TEXT, speaker=VOICE, params={"non_streaming_mode": False}, deadline_s=600)
    talker = next(d for d in done.stage_timings if d.stage_id == 0)
    n_in, n_out = talker.num_prompt_tokens, talker.num_output_tokens
    assert usage == {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out}
    checks.check_sse_is_the_answer(client, "mp3", **request)  # what LiveKit's plugin asks: SSE of mp3

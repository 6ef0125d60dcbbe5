"""Voice cloning through POST /v1/audio/speech on the tiny Qwen3-TTS Base pipeline
(tiny_qwen3_tts.yaml with the Base checkpoint: the entry talker stage encodes the clip on its
preparing thread, the decoder decodes an in-context clip's codes first), served by a real launcher
with `--http`, through the `openai` SDK (vllm-omni's fields in `extra_body`): the PCM answer is
what the qwen-tts 0.1.1 reference's `generate_voice_clone` returns for the same clip and text (its
own venv; fp32, greedy, repetition penalty 1.05 as the YAML), x-vector and in-context, a 16 kHz
stereo clip included (down-mixed and resampled, as the reference does), within WAV_ATOL plus
PCM16 rounding, in the text-streaming prompt mode (the default of both generate_voice_clone and
vllm-omni for Base; in context the text zipped with the clip's frames, shorter or longer than them)
and the whole-text one (`non_streaming_mode: true`); a voice stored with POST /v1/audio/voices
speaks as its clip does inline; every bad input is a 400 naming what is wrong, and the server goes
on serving."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile

from omni_mp.models.registry import resolve_model
from tests.launcher import ServedPipeline
from tests.qwen3_tts_oracle import OracleRun, require_reference, run_reference
from tests.speech_checks import KEY, pcm_samples, serve_tiny_tts

pytestmark = pytest.mark.engine

BASE = "tiny-qwen3-tts-base"
FRAMES = 24  # the talker's max_tokens here: 23 frames
FRAME_SAMPLES = 1920
WAV_ATOL = 2e-4 + 1 / 32768  # streamed vs one-shot (tests/test_qwen3_tts_codec.py) and PCM16's step
TEXT = "hello there, how are you?"
LONG_TEXT = "hello there, how are you? " * 4  # in context: more text rows than the clip's 26 codec rows
REF_TEXT = "the quick brown fox"


def _clip(seconds: float, rate: int, hz: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.3 * np.sin(2 * np.pi * hz * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    if channels == 1:
        return mono.astype(np.float32)
    return np.stack([mono, 0.5 * mono], axis=1).astype(np.float32)  # unequal channels: the mean matters


def _wav_b64(samples: np.ndarray, rate: int) -> str:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="FLOAT")  # the samples exactly
    return base64.b64encode(out.getvalue()).decode()


def _wav_url(samples: np.ndarray, rate: int) -> str:
    return "data:audio/wav;base64," + _wav_b64(samples, rate)


XVEC_CLIP = (_clip(2.0, 24000, 220), 24000)
ICL_CLIP = (_clip(2.0, 24000, 330), 24000)
ODD_CLIP = (_clip(1.5, 16000, 260, channels=2), 16000)  # 16 kHz stereo: resampled and down-mixed
WHOLE_TEXT = {"non_streaming_mode": True}
CASES: dict[str, dict[str, Any]] = {
    "xvector": {"clip": XVEC_CLIP, "x_vector_only_mode": True},
    "in_context": {"clip": ICL_CLIP, "ref_text": REF_TEXT},
    "in_context_long_text": {"clip": ICL_CLIP, "ref_text": REF_TEXT, "text": LONG_TEXT},
    "16k_stereo": {"clip": ODD_CLIP, "x_vector_only_mode": True},
    "xvector_whole_text": {"clip": XVEC_CLIP, "x_vector_only_mode": True, **WHOLE_TEXT},
    "in_context_whole_text": {"clip": ICL_CLIP, "ref_text": REF_TEXT, **WHOLE_TEXT},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedPipeline, str]]:
    require_reference()
    with serve_tiny_tts(tmp_path_factory.mktemp("tts_clone"), FRAMES, BASE) as got:
        yield got


@pytest.fixture(scope="module")
def reference() -> OracleRun:
    """Every case's waveform in one reference run."""
    reqs = [
        {"kind": "clone_wav", "text": c.get("text", TEXT), "language": "auto", "ref_audio_data": _wav_url(*c["clip"]),
         "ref_text": c.get("ref_text"), "x_vector_only_mode": "ref_text" not in c,
         "max_new_tokens": FRAMES, "repetition_penalty": 1.05}
        | ({"non_streaming_mode": c["non_streaming_mode"]} if "non_streaming_mode" in c else {})  # else its default
        for c in CASES.values()
    ]  # fmt: skip
    run = run_reference(resolve_model(BASE), reqs)
    assert run.report["errors"] == {}
    return run


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)


def _speak(url: str, voice: Any = "alloy", text: str = TEXT, **extra: Any) -> np.ndarray:
    with _client(url).audio.speech.with_streaming_response.create(
        model="tiny", voice=voice, input=text, response_format="pcm", extra_body=extra or None
    ) as r:
        return pcm_samples(b"".join(r.iter_bytes()))


def _fields(case: dict[str, Any]) -> dict[str, Any]:
    samples, rate = case["clip"]
    return {"task_type": "Base", "ref_audio": _wav_url(samples, rate)} | {
        k: case[k] for k in ("ref_text", "x_vector_only_mode", "non_streaming_mode") if k in case
    }


def _reference_cut_lead(clip_frames: int, frames: int) -> int:
    """Samples the reference keeps before the new frames' audio: it cuts the in-context clip's
    share at int(clip / total * samples), which float rounding puts one sample early at times;
    our stream starts exactly at the new frames."""
    total = clip_frames + frames
    return clip_frames * FRAME_SAMPLES - int(clip_frames / total * (total * FRAME_SAMPLES))


@pytest.mark.parametrize("name", list(CASES))
def test_cloned_speech_equals_the_reference(
    served: tuple[ServedPipeline, str], reference: OracleRun, name: str
) -> None:
    got = _speak(served[1], text=CASES[name].get("text", TEXT), **_fields(CASES[name]))
    want = reference.wavs[list(CASES).index(name)]
    assert float(np.sqrt(np.mean(want**2))) > 0.03
    if "ref_text" in CASES[name]:
        clip_frames = -(-ICL_CLIP[0].size // FRAME_SAMPLES)
        lead = _reference_cut_lead(clip_frames, got.size // FRAME_SAMPLES)
        want = want[lead:]
    assert got.shape == want.shape, (got.shape, want.shape)
    assert float(np.abs(got - want).max()) <= WAV_ATOL


def test_the_two_modes_differ(served: tuple[ServedPipeline, str], reference: OracleRun) -> None:
    """The clip's text and codes reach the audio: in context is not the x-vector alone; and the
    text mode reaches it (the reference's waveforms of the two modes differ)."""
    url = served[1]
    icl = _speak(url, **_fields(CASES["in_context"]))
    xvec = _speak(url, **(_fields(CASES["in_context"]) | {"x_vector_only_mode": True}))
    assert icl.shape != xvec.shape or float(np.abs(icl - xvec).max()) > 0.01
    wavs = dict(zip(CASES, reference.wavs, strict=True))
    for mode in ("xvector", "in_context"):
        a, b = wavs[mode], wavs[f"{mode}_whole_text"]
        assert a.shape != b.shape or float(np.abs(a - b).max()) > 0.01, mode


def _upload(url: str, samples: np.ndarray, rate: int, **form: str) -> httpx.Response:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="FLOAT")
    files = {"audio_sample": ("clip.wav", out.getvalue(), "audio/wav")}
    return httpx.post(
        f"{url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}, files=files, data=form, timeout=60
    )


@pytest.mark.parametrize("name", ["xvector", "in_context"])
def test_a_stored_voice_speaks_as_its_clip(served: tuple[ServedPipeline, str], name: str) -> None:
    url, case = served[1], CASES[name]
    form = {"name": f"voice-{name}", "consent": "test"} | ({"ref_text": case["ref_text"]} if "ref_text" in case else {})
    made = _upload(url, *case["clip"], **form)
    assert made.status_code == 200, made.text
    voice = made.json()
    assert voice["object"] == "audio.voice" and voice["name"] == f"voice-{name}"
    inline = _speak(url, **_fields(case))
    by_id = _speak(url, voice={"id": voice["id"]})
    as_string = _speak(url, voice=voice["id"], non_streaming_mode=False)  # Base's default, named
    np.testing.assert_array_equal(by_id, inline)
    np.testing.assert_array_equal(as_string, inline)
    listed = httpx.get(f"{url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert voice["id"] in [v["id"] for v in listed["data"]]


def _bad(url: str, match: str, voice: Any = "alloy", text: str = TEXT, **extra: Any) -> None:
    with pytest.raises(openai.BadRequestError, match=match):
        _speak(url, voice=voice, text=text, **extra)


def test_bad_input_is_named_and_the_server_goes_on(served: tuple[ServedPipeline, str]) -> None:
    url = served[1]
    good = _fields(CASES["xvector"])
    _bad(url, "unknown voice 'nobody'.*ref_audio", voice="nobody")
    _bad(url, "no text to speak", text="   ", **good)
    _bad(url, "input", text="a" * 4097, **good)
    _bad(url, "silent", **(good | {"ref_audio": _wav_url(np.zeros(24000 * 2, np.float32), 24000)}))
    _bad(url, "too short", **(good | {"ref_audio": _wav_url(_clip(0.5, 24000, 220), 24000)}))
    _bad(url, "max_audio_s=30", **(good | {"ref_audio": _wav_url(_clip(31, 24000, 220), 24000)}))
    _bad(url, "below 8000 Hz", **(good | {"ref_audio": _wav_url(_clip(2, 4000, 220), 4000)}))
    _bad(url, "fetches nothing", **(good | {"ref_audio": "https://example.com/clip.wav"}))
    _bad(url, "not valid base64", **(good | {"ref_audio": "%%%"}))
    _bad(url, "task_type 'CustomVoice'", **(good | {"task_type": "CustomVoice"}))
    _bad(url, "needs the clip's text", **(good | {"x_vector_only_mode": False}))
    _bad(url, "max_new_tokens", **(good | {"max_new_tokens": FRAMES + 1}))
    _bad(url, "non_streaming_mode", **(good | {"non_streaming_mode": "yes"}))
    got = _speak(url, **good)  # and a good request still speaks
    assert float(np.sqrt(np.mean(got**2))) > 0.03

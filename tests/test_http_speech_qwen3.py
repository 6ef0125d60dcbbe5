"""POST /v1/audio/speech on the tiny Qwen3-Omni pipeline (thinker -> talker with its code
predictor -> code2wav), served by a real launcher with `--http`: the talker's 16 codes of every
frame for the input equal transformers' Qwen3OmniMoeForConditionalGeneration.generate() on the
same checkpoint (fp32, greedy) with the thinker's reply forced to the input's tokens then
<|im_end|>, the waveform within WAV_ATOL / WAV_RTOL, and the HTTP answer is that audio. The
rest of the endpoint (formats, SSE, speed, clients, errors) is family-independent and tested on
Qwen2.5-Omni (tests/test_http_speech.py); here: the voices, lower-case in this family."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import torch

from omni_mp.client.omni_client import OmniClient
from omni_mp.http.speech import SPEECH_REQUEST
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from tests.hf_oracle import reply_ids
from tests.hf_oracle_qwen3_omni import omni_generate
from tests.launcher import ServedPipeline, settled_client
from tests.speech_checks import KEY, Decoded, pcm_samples
from tests.test_qwen3_omni_pipeline import MIN_MARGIN, TALKER_FRAMES, Run

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen3_omni.yaml"
TEXT = "Good morning, how are you today?"
TEXTS = {
    "short": TEXT,
    "long": "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the distant hills.",
}
# Streamed code2wav against transformers' one-shot decode, measured: "short" (20 frames, rms
# 0.096) relative L2 2.5e-5, max abs 2.2e-5; "long" (60 frames, rms 0.10) 2.4e-5, 2.8e-5: float
# summation order, as the pipeline test measures (tests/test_qwen3_omni_pipeline.py: <= 2.5e-5
# over 12 requests); its bounds, about 4x that and 1000x below the signal.
WAV_ATOL = 1e-4
WAV_RTOL = 1e-4
PCM_LSB = 1 / 32768


@pytest.fixture(scope="module")
def served(shared_tiny_qwen3_omni: tuple[ServedPipeline, str]) -> tuple[ServedPipeline, str]:
    return shared_tiny_qwen3_omni  # tests/shared_servers.py


@pytest.fixture
def zmq(served: tuple[ServedPipeline, str]) -> Iterator[OmniClient]:
    with settled_client(served[0].endpoint) as c:
        yield c  # type: ignore[misc]


def _speech(url: str, text: str, voice: str, fmt: str = "pcm") -> bytes:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)
    with client.audio.speech.with_streaming_response.create(
        model="tiny",
        voice=voice,
        input=text,
        response_format=fmt,  # type: ignore[arg-type]
    ) as r:
        return b"".join(r.iter_bytes())


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_talker_frames_for_the_input_equal_transformers(
    served: tuple[ServedPipeline, str], zmq: OmniClient, name: str
) -> None:
    text = TEXTS[name]
    model_dir = resolve_model("tiny-qwen3-omni")
    prompt = SPEECH_REQUEST.format(input=text)
    events = zmq.stream(prompt, forced_reply=text, speaker="ethan", hidden_states=True, deadline_s=900)
    run = Run(list(events))
    reply = reply_ids(model_dir, text)
    want = omni_generate(model_dir, prompt, speaker="ethan", talker_max_new_tokens=TALKER_FRAMES, forced_reply=reply)
    assert run.tokens[0] == reply == want.thinker_ids  # the thinker's reply is the input, no word more
    timings = {d.stage_id: d for d in run.finished.stage_timings}
    assert timings[0].num_prompt_tokens == len(want.prompt_ids)
    frames = run.frames()
    assert min(want.code_margins) > MIN_MARGIN
    assert frames.shape == want.codes.shape, (frames.shape, want.codes.shape)
    assert torch.equal(frames, want.codes)
    got, ref = run.audio, want.wav
    assert got is not None and run.sample_rate == 24_000 and got.shape == ref.shape
    rel, max_abs = float((got - ref).norm() / ref.norm()), float((got - ref).abs().max())
    rms = float(ref.pow(2).mean().sqrt())
    print(f"[{name}] {frames.shape[0]} frames: relative L2 {rel:.2e}, max abs {max_abs:.2e}, rms {rms:.2e}")
    assert rel <= WAV_RTOL and max_abs <= WAV_ATOL and rms >= 100 * WAV_ATOL
    free = zmq.generate(prompt, final_stages=[0], deadline_s=600)  # control: unforced, it says something else
    assert free.outputs[0].token_ids != reply
    pcm = pcm_samples(_speech(served[1], text, "Ethan"))  # the HTTP answer is that audio
    want_pcm = np.clip(got.numpy(), -1, 1)
    assert pcm.shape == want_pcm.shape and np.abs(pcm - want_pcm).max() <= PCM_LSB


def test_voices_of_this_family_and_their_aliases(served: tuple[ServedPipeline, str]) -> None:
    url = served[1]
    r = httpx.get(f"{url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    listed = {v["id"]: v["aliases"] for v in r.json()["data"]}
    assert sorted(listed) == ["aiden", "chelsie", "ethan"]
    assert "alloy" in listed["chelsie"] and "ash" in listed["ethan"] and "ballad" in listed["aiden"]
    wav = Decoded(_speech(url, TEXT, "ballad", "wav"))
    assert wav.rate == 24_000 and wav.channels == 1
    assert np.array_equal(wav.samples, pcm_samples(_speech(url, TEXT, "Aiden")))

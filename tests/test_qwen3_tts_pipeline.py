"""Qwen3-TTS end to end (omni_mp/stage_configs/tiny_qwen3_tts.yaml): a real launcher process with two
stages (our vLLM talker with its code predictor, its prompt built from the request's text, voice
and instructions; the streaming 12 Hz codec decoder) on the tiny CustomVoice checkpoint, against
the qwen-tts 0.1.1 reference in its own venv on the same checkpoint (fp32, greedy, repetition
penalty 1.05 on both sides, its default): every frame's 16 codes equal, and the streamed audio
equals the reference's one-shot decode within WAV_ATOL (max abs) / WAV_RTOL (relative L2); in the
whole-text prompt mode (the default here) and the text-streaming one (params non_streaming_mode
false: the entry stage feeds the text's rest a token per frame)."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.models.qwen3_omni.codes import NO_CODE, codes_of_rows
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.launcher import ServedPipeline, settled_client
from tests.qwen3_tts_oracle import require_reference, run_reference

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen3_tts.yaml"
STEPS = 16  # talker steps per request here (the reference's max_new_tokens): 15 frames
# Streamed vs the reference's one-shot waveform: measured max abs <= 1.4e-5 (tests/test_qwen3_tts_codec.py).
WAV_ATOL = 2e-4
WAV_RTOL = 1e-4
CASES: dict[str, dict[str, Any]] = {
    "instructed": {"text": "hello there, how are you?", "voice": "vivian", "instructions": "speak slowly",
                   "language": "english"},
    "plain": {"text": "the quick brown fox", "voice": "ryan"},
    "dialect": {"text": "good morning to you", "voice": "dylan", "instructions": "cheerful"},
    "text-streamed": {"text": "hello there, how are you?", "voice": "vivian", "instructions": "speak slowly",
                      "language": "english", "non_streaming_mode": False},
}  # fmt: skip


def _params(case: dict[str, Any]) -> dict[str, Any]:
    return {k: case[k] for k in ("instructions", "language", "non_streaming_mode") if k in case}


@functools.cache
def reference() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    require_reference()
    reqs = [
        {"kind": "custom_voice", "text": c["text"], "speaker": c["voice"], "language": c.get("language", "auto"),
         "instruct": c.get("instructions", ""), "max_new_tokens": STEPS, "repetition_penalty": 1.05,
         "non_streaming_mode": c.get("non_streaming_mode", True)}
        for c in CASES.values()
    ]  # fmt: skip
    run = run_reference(resolve_model("tiny-qwen3-tts-custom-voice"), reqs)
    assert run.report["errors"] == {}
    return {name: (run.codes[i], run.wavs[i]) for i, name in enumerate(CASES)}


@pytest.fixture(scope="module")
def pipeline(shared_tiny_qwen3_tts: tuple[ServedPipeline, str]) -> ServedPipeline:
    reference()  # skips at once when the reference venv is absent
    return shared_tiny_qwen3_tts[0]  # tests/shared_servers.py (requests here set their max_tokens)


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


class Run:
    def __init__(self, events: list[StageOutputChunk | Finished]) -> None:
        rows: list[torch.Tensor] = []
        self.prompt_len: int | None = None
        self.tokens: list[int] = []
        for ev in events:
            if isinstance(ev, StageOutputChunk) and ev.stage_id == 0:
                self.tokens += ev.token_ids
                if ev.prompt_token_ids is not None:
                    self.prompt_len = len(ev.prompt_token_ids)
                if ev.hidden is not None and ev.hidden.last is not None:
                    rows.append(ev.hidden.last.clone())
        done = next(ev for ev in events if isinstance(ev, Finished))
        out = {o.stage_id: o for o in done.outputs}
        self.audio, self.sample_rate = out[1].audio, out[1].sample_rate
        assert self.prompt_len is not None and rows
        self.frames = codes_of_rows(torch.cat(rows))[self.prompt_len :]


def _speak(client: OmniClient, name: str) -> Run:
    case = CASES[name]
    sampling = {0: SamplingParamsMsg(max_tokens=STEPS, min_tokens=2, temperature=0.0, repetition_penalty=1.05)}
    events = client.stream(case["text"], speaker=case["voice"], params=_params(case), sampling=sampling,
                           deadline_s=600, hidden_states=True)  # fmt: skip
    return Run(list(events))


def check(run: Run, name: str) -> None:
    codes, wav = reference()[name]
    assert not bool((run.frames == NO_CODE).any())
    assert run.frames.shape == codes.shape, (run.frames.shape, codes.shape)
    for f in range(codes.shape[0]):
        assert run.frames[f].tolist() == codes[f].tolist(), f"{name} frame {f}"
    assert run.tokens[: codes.shape[0]] == codes[:, 0].tolist()
    want = torch.from_numpy(wav)
    rms = float(want.pow(2).mean().sqrt())
    assert rms > 100 * WAV_ATOL  # loud enough for the bounds to mean something
    assert run.sample_rate == 24_000 and run.audio is not None and run.audio.shape == want.shape
    assert float((run.audio - want).abs().max()) <= WAV_ATOL
    assert float((run.audio - want).norm() / want.norm()) <= WAV_RTOL


@pytest.mark.parametrize("name", list(CASES))
def test_single_request_equals_the_reference(client: OmniClient, name: str) -> None:
    check(_speak(client, name), name)


def test_eight_concurrent_mixed_requests_each_equal_the_reference(client: OmniClient) -> None:
    names = [list(CASES)[i % len(CASES)] for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda n: _speak(client, n), names))
    for name, run in zip(names, runs, strict=True):
        check(run, name)


def test_first_audio_arrives_before_the_last_code(client: OmniClient) -> None:
    """The decoder starts on the talker's first frame: the first audio chunk reaches the client
    before the talker's last frame."""
    sampling = {0: SamplingParamsMsg(max_tokens=160, min_tokens=2, temperature=0.0)}
    t_audio = t_talker_done = None
    for ev in client.stream("tell me a story", speaker="vivian", sampling=sampling, deadline_s=600):
        now = time.monotonic()
        if isinstance(ev, StageOutputChunk):
            if ev.stage_id == 1 and t_audio is None and ev.additional_information:
                t_audio = now
            if ev.stage_id == 0 and ev.finished:
                t_talker_done = now
    assert t_audio is not None and t_talker_done is not None
    assert t_audio < t_talker_done, f"first audio {t_audio - t_talker_done:+.3f}s after the talker's last code"


def test_bad_requests_fail_clearly_and_others_go_on(client: OmniClient) -> None:
    with pytest.raises(RequestError, match="unknown speaker 'nobody'; stage 0 has \\['dylan', 'ryan', 'vivian'\\]"):
        client.generate("hello", speaker="nobody", deadline_s=60)
    with pytest.raises(RequestError, match="unknown language 'klingon'"):
        client.generate("hello", speaker="vivian", params={"language": "klingon"}, deadline_s=60)
    with pytest.raises(RequestError, match="empty"):
        client.generate("", speaker="vivian", deadline_s=60)
    check(_speak(client, "plain"), "plain")

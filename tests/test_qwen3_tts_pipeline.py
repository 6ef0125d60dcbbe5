"""Qwen3-TTS end to end (omni_mp/stage_configs/tiny_qwen3_tts.yaml): a real launcher process with two
stages (our vLLM talker with its code predictor, its prompt built from the request's text, voice
and instructions; the streaming 12 Hz codec decoder) on the tiny CustomVoice checkpoint, against
the qwen-tts 0.1.1 reference in its own venv on the same checkpoint (fp32, greedy, repetition
penalty 1.05 on both sides, its default): every frame's 16 codes equal, and the streamed audio
equals the reference's one-shot decode within WAV_ATOL (max abs) / WAV_RTOL (relative L2); in the
whole-text prompt mode (the default here) and the text-streaming one (params non_streaming_mode
false: the entry stage feeds the text's rest a token per frame).

The same on the released 1.7B's shape (`tiny-qwen3-tts-narrow-predictor`: a code predictor
narrower than the talker behind `small_to_mtp_projection`, one more served pipeline), and its
sampled code predictor against the reference's settings for that checkpoint (its
generation_config.json's `subtalker_*`, as the reference reads them). Our draws come from
another RNG than the reference's, so no code can be compared; the oracle is the reference's own
logits for each step of our sampled frames (fed the same earlier codes), and the settings'
effect is tested where it shows: every draw inside the set those settings keep (a test whose
power against the other settings is computed from the same logits), and the draws' likelihood
under the settings' distribution (a z-score, with its power against other temperatures)."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.models.qwen3_omni.codes import NO_CODE, codes_of_rows
from omni_mp.models.qwen3_tts.talker_view import SubtalkerSampling
from omni_mp.models.qwen3_tts.tiny import NARROW_SUBTALKER
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.launcher import ServedPipeline, settled_client
from tests.qwen3_tts_oracle import require_reference, run_reference, warped_scores
from tests.speech_checks import serve_tiny_tts

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen3_tts.yaml"
CUSTOM_VOICE = "tiny-qwen3-tts-custom-voice"
NARROW = "tiny-qwen3-tts-narrow-predictor"  # the 1.7B's shape: predictor 32 wide under a 64-wide talker
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


def _ref_request(case: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"kind": "custom_voice", "text": case["text"], "speaker": case["voice"],
            "language": case.get("language", "auto"), "instruct": case.get("instructions", ""),
            "max_new_tokens": STEPS, "repetition_penalty": 1.05,
            "non_streaming_mode": case.get("non_streaming_mode", True), **more}  # fmt: skip


@functools.cache
def reference(model: str = CUSTOM_VOICE) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    require_reference()
    run = run_reference(resolve_model(model), [_ref_request(c) for c in CASES.values()])
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


GREEDY = SamplingParamsMsg(max_tokens=STEPS, min_tokens=2, temperature=0.0, repetition_penalty=1.05)


def _speak(client: OmniClient, name: str, sampling: SamplingParamsMsg = GREEDY) -> Run:
    case = CASES[name]
    events = client.stream(case["text"], speaker=case["voice"], params=_params(case), sampling={0: sampling},
                           deadline_s=600, hidden_states=True)  # fmt: skip
    return Run(list(events))


def check(run: Run, name: str, model: str = CUSTOM_VOICE) -> None:
    codes, wav = reference(model)[name]
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


# ---- the released 1.7B's shape: a code predictor narrower than the talker ----------------------
NARROW_CASES = ["instructed", "dialect"]
SAMPLED_FRAMES = 96  # sampled requests of one frame each: 96 x 15 code predictor draws
# Our logits differ from the reference's by float rounding (~1e-6): a draw counts as kept when
# it lies within these of the kept set's edge (in scaled logit, and in top-p mass).
EDGE_LOGIT, EDGE_MASS = 1e-3, 1e-3
Z_BOUND = 4.5  # |z| of the draws' log-likelihood under the settings' distribution
Z_POWER = 9.0  # |expected z| under each alternative temperature: the bound cannot pass them


@pytest.fixture(scope="module")
def narrow_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniClient]:
    reference(NARROW)  # skips at once when the reference venv is absent
    with serve_tiny_tts(tmp_path_factory.mktemp("narrow"), STEPS, NARROW) as (pipeline, _):
        with settled_client(pipeline.endpoint) as c:
            yield c  # type: ignore[misc]


@pytest.mark.parametrize("name", NARROW_CASES)
def test_narrow_code_predictor_equals_the_reference(narrow_client: OmniClient, name: str) -> None:
    """small_to_mtp_projection (talker 64 -> predictor 32, bias drawn): every frame's codes and
    the audio equal the reference's, greedy."""
    check(_speak(narrow_client, name), name, NARROW)


def _allowed(logits: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    """[.., V] bool: the codes settings `s` keep (transformers' warpers on the reference's
    logits), widened by the rounding margins at the set's edge."""
    scaled = logits / s["subtalker_temperature"]
    kept = warped_scores(logits, s).isfinite()
    loose = warped_scores(logits, {**s, "subtalker_top_p": min(1.0, s["subtalker_top_p"] + EDGE_MASS)}).isfinite()
    edge = torch.where(kept, scaled, torch.full_like(scaled, float("inf"))).amin(-1, keepdim=True) - EDGE_LOGIT
    return loose | (scaled >= edge)


def _loglik_z(logq: torch.Tensor, draws: torch.Tensor) -> float:
    """z of sum(log q(draw)) against its mean and variance were each draw from q (a frame's draws
    depend on its earlier ones: a martingale, whose sum is still close to normal). `draws`
    [.., V]: one-hot draws, or a distribution per step (the expected z were draws from it)."""
    lq = torch.where(logq.isfinite(), logq, torch.zeros_like(logq))
    q = logq.exp()
    mean = (q * lq).sum(-1)
    var = (q * lq**2).sum(-1) - mean**2
    return float(((draws * lq).sum() - mean.sum()) / var.sum().sqrt())


def _sampled_frames(client: OmniClient) -> torch.Tensor:
    """Frame 0 of SAMPLED_FRAMES requests sampled with the served defaults (temperature 0.9,
    top-k 50): [N, 16], each decoded to its 1920 samples."""
    sampled = SamplingParamsMsg(max_tokens=2, min_tokens=2, temperature=0.9, top_k=50, repetition_penalty=1.05)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda _: _speak(client, "instructed", sampled), range(SAMPLED_FRAMES)))
    assert all(r.frames.shape == (1, 16) and r.audio is not None and r.audio.numel() == 1920 for r in runs)
    return torch.stack([r.frames[0] for r in runs])


def test_narrow_sampled_code_predictor_uses_the_reference_settings(narrow_client: OmniClient) -> None:
    """Sampled requests: their frames' codes 1..15 are drawn with the checkpoint's `subtalker_*`
    settings (top-k 12, top-p 0.95, temperature 0.5; not the reference's defaults nor
    Qwen3-Omni's), judged on the reference's logits for each step given our earlier codes."""
    from omni_mp.models.qwen3_omni.vllm_hooks_talker import OMNI_CODE_SAMPLING  # (imports vLLM)

    frames = _sampled_frames(narrow_client)
    ask = _ref_request(CASES["instructed"], kind="cp_logits", frames=frames.tolist())
    oracle = run_reference(resolve_model(NARROW), [ask])
    assert oracle.report["errors"] == {}
    s = oracle.report["subtalker"]  # the reference's reading of generation_config.json
    assert s == msgspec.to_builtins(NARROW_SUBTALKER)  # the tiny's, which the checks below tell apart
    logits = torch.from_numpy(oracle.extras[0]["cp_logits"]).double()  # [N, 15, V]
    drawn = frames[:, 1:].long()
    assert int((drawn != logits.argmax(-1)).sum()) >= drawn.numel() // 10  # sampled, not greedy

    # 1. every draw inside the kept set (up to rounding at its edge) ...
    allowed = _allowed(logits, s)
    outside = int((~allowed.gather(-1, drawn[..., None])).sum())
    assert outside == 0, f"{outside} draws outside the kept set"
    # ... which draws with the reference's defaults or Qwen3-Omni's settings would leave
    omni = {"subtalker_top_k": OMNI_CODE_SAMPLING.top_k, "subtalker_top_p": OMNI_CODE_SAMPLING.top_p,
            "subtalker_temperature": OMNI_CODE_SAMPLING.temperature}  # fmt: skip
    for name, other in {"defaults": msgspec.to_builtins(SubtalkerSampling()), "qwen3_omni": omni}.items():
        expected_out = float((warped_scores(logits, other).softmax(-1) * ~allowed).sum())
        assert expected_out >= 20, (name, expected_out)  # P(none outside) <= e^-20 under them

    # 2. the draws' likelihood under the settings' distribution, and its power against others
    logq = warped_scores(logits, s).log_softmax(-1)
    z = _loglik_z(logq, torch.nn.functional.one_hot(drawn, logq.shape[-1]).double())
    powers = {t: _loglik_z(logq, warped_scores(logits, {**s, "subtalker_temperature": t}).softmax(-1))
              for t in (0.25, 0.9, 1.0)}  # fmt: skip
    print(f"\n[narrow sampled] z {z:+.2f}; expected z at other temperatures {powers}")
    assert abs(z) <= Z_BOUND, z
    assert all(abs(v) >= Z_POWER for v in powers.values()), powers

"""Qwen3-Omni end to end (omni_mp/stage_configs/tiny_qwen3_omni.yaml): a real launcher process with three
stages (vLLM's thinker, our vLLM talker with its code predictor, the streaming code2wav) on the
tiny checkpoint, against transformers' `Qwen3OmniMoeForConditionalGeneration.generate` on the
same checkpoint and speaker (fp32; greedy thinker, talker and code predictor; the talker's
repetition penalty 1.05, generate's default, on both sides).

Thinker tokens and the 16 codes of every frame must be equal; where they are not, the failure
names the step and transformers' top-2 logit margin there, and every compared step must have a
margin above MIN_MARGIN, so a pass is not luck. The waveform is streamed chunk by chunk by
code2wav and compared with transformers' one-shot decode (replies under its 300-frame chunk)
within WAV_ATOL (max abs) and WAV_RTOL (relative L2): the streamed chunks equal the one-shot
samples up to float summation order (code2wav.py). The tiny checkpoint's code2wav has audible
weights (code2wav_weights.init_code2wav: rms ~0.1), and the test checks the audio is loud enough
and a one-sample shift far outside the bounds, so they mean something. About 2.5-9 minutes on
2 CPU cores (machine load), most of it transformers' generate on the CPU."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.models.qwen3_omni.codes import NO_CODE, codes_of_rows
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.hf_oracle import assert_same_tokens
from tests.hf_oracle_qwen3_omni import OmniResult, omni_generate
from tests.launcher import ServedPipeline, settled_client
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen3_omni.yaml"
THINKER_TOKENS = 48  # stage 0's max_tokens in the YAML
TALKER_FRAMES = 512  # stage 1's
MIN_MARGIN = 1e-5
# Streamed vs transformers' one-shot waveform (48 frames a reply, in chunks of 1 and 12 frames),
# measured over 12 requests (text/audio/image, three speakers) with audio of rms 0.097-0.099:
# max abs error <= 2.5e-5, relative L2 <= 2.3e-5 (float summation order, amplified by the
# random tiny weights; code2wav.py). The bounds are 4x that and 1000x below the signal.
WAV_ATOL = 1e-4  # max abs error
WAV_RTOL = 1e-4  # relative L2
WAV_MIN_RMS = 100 * WAV_ATOL  # transformers' waveform must be this loud (control)

CASES: dict[str, dict[str, Any]] = {
    "text": dict(text="Tell me a short story about the sea."),
    "audio": dict(text="What do you hear?", audio=tone(1.0)),
    "image": dict(text="Describe the picture.", image=pattern(64)),
}


@functools.cache
def oracle(name: str, speaker: str) -> OmniResult:
    case = CASES[name]
    return omni_generate(
        resolve_model("tiny-qwen3-omni"), case["text"], audio=case.get("audio"), image=case.get("image"),
        speaker=speaker, thinker_max_new_tokens=THINKER_TOKENS, talker_max_new_tokens=TALKER_FRAMES,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(shared_tiny_qwen3_omni: tuple[ServedPipeline, str]) -> ServedPipeline:
    return shared_tiny_qwen3_omni[0]  # tests/shared_servers.py (the shipped config, served with HTTP too)


def test_moe_stages_warmed_their_kernels_before_serving(pipeline: ServedPipeline) -> None:
    """The YAML turns the fused-MoE warm-up on (a GPU's default) for the thinker and the talker:
    each ran its dummy forwards before Ready, and the tests of this module then check that
    both still serve exactly what transformers computes."""
    for stage in (0, 1):
        lines = [ln for ln in pipeline.lines if f"stage {stage}: ready in" in ln]
        assert len(lines) == 1 and "fused-MoE kernels warmed at" in lines[0], "".join(pipeline.lines[-40:])
        sizes = int(lines[0].split("warmed at ", 1)[1].split(" ", 1)[0])
        assert sizes >= 4  # eager here: from one token (a Triton constant) up, each tile config


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


class Run:
    """One request's events: the thinker's tokens, the talker's frames (its rows' codes), the audio."""

    def __init__(self, events: list[StageOutputChunk | Finished]) -> None:
        self.tokens: dict[int, list[int]] = {}
        rows: list[torch.Tensor] = []
        self.talker_prompt_len: int | None = None
        self.finished = next(ev for ev in events if isinstance(ev, Finished))
        for ev in events:
            if not isinstance(ev, StageOutputChunk):
                continue
            self.tokens.setdefault(ev.stage_id, []).extend(ev.token_ids)
            if ev.stage_id == 1:
                if ev.prompt_token_ids is not None:
                    self.talker_prompt_len = len(ev.prompt_token_ids)
                if ev.hidden is not None and ev.hidden.last is not None:
                    rows.append(ev.hidden.last.clone())
        self.codes = codes_of_rows(torch.cat(rows)) if rows else None
        out = {o.stage_id: o for o in self.finished.outputs}
        self.audio = out[2].audio if 2 in out else None
        self.sample_rate = out[2].sample_rate if 2 in out else None

    def frames(self) -> torch.Tensor:
        assert self.codes is not None and self.talker_prompt_len is not None
        frames = self.codes[self.talker_prompt_len :]
        assert not (frames == NO_CODE).any(), "a talker row past its prompt carries no frame"
        return frames


def _stream(client: OmniClient, name: str, speaker: str, **kw: Any) -> Run:
    case = CASES[name]
    events = client.stream(
        case["text"],
        audios=[(torch.from_numpy(case["audio"]), 16_000)] if "audio" in case else [],
        images=[torch.from_numpy(case["image"])] if "image" in case else [],
        speaker=speaker,
        deadline_s=900,
        hidden_states=True,  # the talker's rows: each frame's 16 codes
        **kw,
    )
    return Run(list(events))


def check(run: Run, name: str, speaker: str) -> None:
    want = oracle(name, speaker)
    assert_same_tokens(run.tokens[0], want.thinker_ids, want.thinker_margins, "thinker")
    assert min(want.thinker_margins) > MIN_MARGIN and min(want.code_margins) > MIN_MARGIN
    frames = run.frames()
    group0 = run.tokens[1][: frames.shape[0]]
    assert frames[:, 0].tolist() == group0  # a frame's group 0 is the talker's token of its step
    assert frames.shape == want.codes.shape, f"{frames.shape[0]} frames, transformers {want.codes.shape[0]}"
    for f in range(frames.shape[0]):
        assert frames[f].tolist() == want.codes[f].tolist(), f"frame {f}: {frames[f].tolist()} != {want.codes[f]}"
    assert run.sample_rate == 24_000 and run.audio is not None
    assert run.audio.dtype == torch.float32 and run.audio.shape == want.wav.shape, (run.audio.shape, want.wav.shape)
    # Controls: the bounds are far below the signal, and one sample of misalignment misses them.
    rms = float(want.wav.pow(2).mean().sqrt())
    assert rms >= WAV_MIN_RMS, f"transformers' waveform rms {rms:.2e}: too quiet for the bounds to mean anything"
    shifted = float((want.wav[1:] - want.wav[:-1]).norm() / want.wav.norm())
    assert shifted > 100 * WAV_RTOL, f"a one-sample shift is only {shifted:.2e} off"
    max_abs = float((run.audio - want.wav).abs().max())
    rel = float((run.audio - want.wav).norm() / want.wav.norm())
    assert max_abs <= WAV_ATOL, f"max abs error {max_abs:.2e} against transformers' waveform (rms {rms:.2e})"
    assert rel <= WAV_RTOL, f"relative L2 {rel:.2e} against transformers' waveform"


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_request_equals_transformers(client: OmniClient, name: str) -> None:
    check(_stream(client, name, "ethan"), name, "ethan")


def test_eight_concurrent_mixed_requests_each_equal_transformers(client: OmniClient) -> None:
    """Text, audio and image requests with two speakers, all in flight together."""
    jobs = [(sorted(CASES)[i % 3], ("ethan", "chelsie")[i % 2]) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda job: _stream(client, *job), jobs))
    for (name, speaker), run in zip(jobs, runs, strict=True):
        check(run, name, speaker)


def test_first_audio_arrives_before_the_thinker_finishes(client: OmniClient) -> None:
    """The talker starts after the thinker's first token, code2wav on the first frames: the
    first audio chunk reaches the client before the thinker's last token."""
    sampling = {0: SamplingParamsMsg(max_tokens=400, ignore_eos=True), 1: SamplingParamsMsg(max_tokens=64)}
    t_audio = t_thinker_done = None
    for ev in client.stream("Tell me a long story.", sampling=sampling, deadline_s=900):
        now = time.monotonic()
        if isinstance(ev, StageOutputChunk):
            if ev.stage_id == 2 and t_audio is None and ev.additional_information:
                t_audio = now
            if ev.stage_id == 0 and ev.finished:
                t_thinker_done = now
    assert t_audio is not None and t_thinker_done is not None
    assert t_audio < t_thinker_done, f"first audio {t_audio - t_thinker_done:+.3f}s after the thinker finished"


def test_text_only_per_request(client: OmniClient) -> None:
    """`final_stages=[0]`: the thinker alone runs; its text equals transformers' thinker."""
    done = client.generate(CASES["text"]["text"], final_stages=[0], deadline_s=600)
    assert [o.stage_id for o in done.outputs] == [0]
    want = oracle("text", "ethan")
    assert_same_tokens(done.outputs[0].token_ids, want.thinker_ids, want.thinker_margins, "thinker")


def test_speakers_are_per_request_and_unknown_ones_fail_clearly(client: OmniClient) -> None:
    with pytest.raises(RequestError, match="unknown speaker 'nobody'"):
        client.generate("Hello", speaker="nobody", deadline_s=60)
    a = _stream(client, "text", "ethan")
    b = _stream(client, "text", "aiden")
    assert a.tokens[0] == b.tokens[0]  # the same reply, in another voice
    check(b, "text", "aiden")

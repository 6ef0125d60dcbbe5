"""Qwen2.5-Omni end to end (omni_mp/stage_configs/tiny_qwen2_5_omni.yaml): a real launcher process
with three stages (vLLM's thinker, our vLLM talker, the token2wav diffusion stage) on the
tiny checkpoint, against transformers' `Qwen2_5OmniForConditionalGeneration.generate` on
the same checkpoint, speaker and noise seed (greedy thinker and talker).

Thinker tokens and talker codes must be equal; where they are not, the failure names the
step and transformers' top-2 logit margin there (a near tie is reported, not hidden), and
every compared step must have a margin above MIN_MARGIN, so a pass is not luck. The
waveform is streamed in chunks by the diffusion stage, so it is compared with the
streamed-vs-one-shot tolerance of test_diffusion_engine (relative L2 error <= 1e-3)."""

from __future__ import annotations

import concurrent.futures
import json
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.media.audio_io import read_audio
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR, DEFAULT
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.hf_oracle import assert_close_audio, assert_same_tokens, omni_generate
from tests.launcher import ServedPipeline, check_shipped_run, config_args, run_cli, settled_client
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen2_5_omni.yaml"
THINKER_TOKENS = 48  # stage 0's max_tokens in the YAML
MIN_MARGIN = 1e-5  # below this a top-2 tie may flip on rounding alone: pick other prompts


def check_against_transformers(
    done: Finished, text: str, *, audio: np.ndarray | None = None, image: np.ndarray | None = None,
    speaker: str = "Chelsie", seed: int = 0,
) -> None:  # fmt: skip
    want = omni_generate(
        resolve_model("tiny-qwen2_5-omni"), text, audio=audio, image=image, speaker=speaker, seed=seed,
        thinker_max_new_tokens=THINKER_TOKENS,
    )  # fmt: skip
    out = {o.stage_id: o for o in done.outputs}
    timings = {d.stage_id: d for d in done.stage_timings}
    assert timings[0].num_prompt_tokens == len(want.prompt_ids)
    assert_same_tokens(out[0].token_ids, want.thinker_ids, want.thinker_margins, "thinker")
    codes = out[1].token_ids[:-1] if out[1].finish_reason == "stop" else out[1].token_ids
    assert_same_tokens(codes, want.codes, want.code_margins, "talker")
    assert min(want.thinker_margins) > MIN_MARGIN and min(want.code_margins) > MIN_MARGIN
    assert out[2].sample_rate == 24_000
    assert_close_audio(out[2].audio, want.wav)


@pytest.fixture(scope="module")
def pipeline(shared_tiny_qwen2_5_omni: tuple[ServedPipeline, str]) -> ServedPipeline:
    return shared_tiny_qwen2_5_omni[0]  # tests/shared_servers.py (the shipped config, served with HTTP too)


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


CASES = {
    "text": dict(text="Tell me a short story about the sea."),
    "audio": dict(text="What do you hear?", audio=tone()),
    "image": dict(text="Describe the picture.", image=pattern()),
}


def _submit(client: OmniClient, case: dict, **kw: object) -> Finished:
    return client.generate(
        case["text"],
        audios=[(torch.from_numpy(case["audio"]), 16_000)] if "audio" in case else [],
        images=[torch.from_numpy(case["image"])] if "image" in case else [],
        deadline_s=600,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_request_equals_transformers(client: OmniClient, name: str) -> None:
    case = CASES[name]
    done = _submit(client, case)
    check_against_transformers(done, case["text"], audio=case.get("audio"), image=case.get("image"))


def test_eight_concurrent_requests_each_equal_transformers(client: OmniClient) -> None:
    """Mixed text, audio and image requests with two speakers and their own seeds, all in
    flight together: batching in every stage changes nothing."""
    jobs = [(sorted(CASES)[i % 3], ("Chelsie", "Ethan")[i % 2], 100 + i) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = [
            pool.submit(_submit, client, CASES[name], speaker=spk, sampling={2: SamplingParamsMsg(seed=seed)})
            for name, spk, seed in jobs
        ]
        results = [f.result() for f in futs]
    for (name, spk, seed), done in zip(jobs, results, strict=True):
        case = CASES[name]
        check_against_transformers(
            done, case["text"], audio=case.get("audio"), image=case.get("image"), speaker=spk, seed=seed
        )


def test_first_audio_arrives_before_the_thinker_finishes(client: OmniClient) -> None:
    """The talker starts after the thinker's first tokens, token2wav on the talker's first
    codes: the first audio chunk reaches the client before the thinker's last token."""
    sampling = {0: SamplingParamsMsg(max_tokens=400, ignore_eos=True), 1: SamplingParamsMsg(max_tokens=96)}
    t_audio = t_thinker_done = None
    for ev in client.stream("Tell me a long story.", sampling=sampling, deadline_s=600):
        now = time.monotonic()
        if isinstance(ev, StageOutputChunk):
            if ev.stage_id == 2 and t_audio is None and ev.additional_information:
                t_audio = now
            if ev.stage_id == 0 and ev.finished:
                t_thinker_done = now
    assert t_audio is not None and t_thinker_done is not None
    assert t_audio < t_thinker_done, f"first audio {t_audio - t_thinker_done:+.3f}s after the thinker finished"


def test_speakers_are_per_request_and_unknown_ones_fail_clearly(client: OmniClient) -> None:
    with pytest.raises(RequestError, match="unknown speaker 'Nobody'"):
        client.generate("Hello", speaker="Nobody", deadline_s=60)
    a = client.generate("Hello there", speaker="Chelsie", deadline_s=600)
    b = client.generate("Hello there", speaker="Ethan", deadline_s=600)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids  # the same reply, in another voice
    assert not torch.equal(a.outputs[-1].audio, b.outputs[-1].audio)


def test_bad_media_fail_only_that_request(client: OmniClient) -> None:
    with pytest.raises(RequestError, match=r"images\[0\]: expected uint8 \[height, width, 3\]"):
        client.generate("Look", images=[torch.zeros(8, 8, dtype=torch.uint8)], deadline_s=60)
    with pytest.raises(RequestError, match="max_audio_s"):
        client.generate("Listen", audios=[(torch.zeros(16_000 * 301), 16_000)], deadline_s=60)
    done = _submit(client, CASES["text"])  # the pipeline still serves
    assert done.outputs[-1].audio is not None


def test_cli_takes_audio_and_image_files_and_writes_wav(tmp_path: Path) -> None:
    from PIL import Image

    from omni_mp.media.audio_io import write_wav

    write_wav(tmp_path / "in.wav", tone(), 16_000, float32=True)  # the oracle gets the same samples
    Image.fromarray(pattern()).save(tmp_path / "in.png")
    out = tmp_path / "out"
    assert DEFAULT == CONFIG.stem
    # The demo's default config (no --config), as tests/test_shipped_configs.py would run it.
    args = [*config_args(DEFAULT), "--prompt", "What is this?", "--audio", "in.wav", "--image", "in.png"]
    proc = run_cli(*args, "--speaker", "Ethan", "--output-dir", str(out), cwd=tmp_path)
    check_shipped_run(DEFAULT, proc, out)
    record = json.loads((out / "req0.json").read_text())
    assert record["audio_files"] == {"2": "req0.stage2.wav"}
    with wave.open(str(out / "req0.stage2.wav")) as w:  # what every player reads: 16-bit PCM
        assert (w.getsampwidth(), w.getnchannels(), w.getframerate()) == (2, 1, 24_000)
    samples, rate = read_audio(out / "req0.stage2.wav")
    assert rate == 24_000
    want = omni_generate(
        resolve_model("tiny-qwen2_5-omni"), "What is this?", audio=tone(), image=pattern(), speaker="Ethan",
        seed=0, thinker_max_new_tokens=THINKER_TOKENS,
    )  # fmt: skip
    assert_close_audio(torch.from_numpy(samples), want.wav)
    assert "s audio" in proc.stdout and "req0:" in proc.stdout  # the one-line summary

"""Text to speech end to end (omni_mp/stage_configs/tiny_tts.yaml): a real launcher process, a tiny AR
stage whose generated ids are codec ids, streamed into a diffusion stage (token2wav on vLLM's
EngineCore with omni_mp's diffusion scheduler and worker) that emits audio chunk by chunk.
The oracle is transformers: greedy tiny-qwen2 gives the codes, its token2wav the waveform;
the stage streams, so it is compared with the streamed-vs-one-shot tolerance of
test_diffusion_engine (relative L2 error <= 1e-3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from omni_mp.client.omni_client import OmniClient
from omni_mp.engines.diffusion.params import DiffusionParams
from omni_mp.media.audio_io import read_audio
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg
from tests.hf_oracle import assert_close_audio, greedy, token2wav, tokenize
from tests.launcher import ServedPipeline, check_shipped_run, config_args, run_cli, serve, settled_client

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_tts.yaml"
N = 120  # stage 0's max_tokens in tiny_tts.yaml: the number of codes
SPI = 480  # samples per code


def oracle(prompt: str, seed: int) -> torch.Tensor:
    m0 = resolve_model("tiny-qwen2")
    codes, _ = greedy(m0, tokenize(m0, prompt), N)
    return token2wav(resolve_model("tiny-token2wav"), codes, DiffusionParams(seed=seed, speaker="Chelsie"))


@pytest.fixture(scope="module")
def pipeline() -> Iterator[ServedPipeline]:
    with serve(CONFIG) as served:
        yield served


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


def test_speech_matches_transformers_with_a_request_seed(client: OmniClient) -> None:
    prompt = "Hello there"
    done = client.generate(prompt, sampling={1: SamplingParamsMsg(seed=7)}, deadline_s=300)
    out = done.outputs[-1]
    assert out.stage_id == 1 and out.sample_rate == 24000 and out.finish_reason == "stop"
    assert out.audio.shape == (N * SPI,)
    assert_close_audio(out.audio, oracle(prompt, seed=7))
    # The diffusion stage started on the first codes, long before stage 0 finished.
    t0, t1 = sorted(done.stage_timings, key=lambda d: d.stage_id)
    assert t1.t_started < t0.t_finished


def test_client_streams_pcm_chunks(client: OmniClient) -> None:
    events = list(client.stream("Tell me a story", deadline_s=300))
    done = events[-1]
    assert isinstance(done, Finished)
    chunks = [ev.additional_information["audio"] for ev in events[:-1] if ev.additional_information]
    assert len(chunks) >= 3  # a 24-code first chunk, then 48-code chunks
    assert chunks[0].numel() < 25 * SPI  # the small first chunk
    torch.testing.assert_close(torch.cat(chunks), done.outputs[-1].audio, atol=0, rtol=0)
    assert_close_audio(done.outputs[-1].audio, oracle("Tell me a story", seed=0))  # the YAML's seed


def test_closing_the_audio_stream_aborts_everywhere(client: OmniClient) -> None:
    stream = client.stream_audio("A long story about robots", request_id="cut", deadline_s=300)
    samples, rate = next(stream)
    assert rate == 24000 and samples.dtype == torch.float32 and samples.numel() > 0
    stream.close()  # the client fixture then checks nothing stays in flight


def test_cli_writes_wav(tmp_path: Path) -> None:
    prompt = "Hello there"
    proc = run_cli(*config_args(CONFIG.stem), "--prompt", prompt, "--output-dir", str(tmp_path), cwd=tmp_path)
    check_shipped_run(CONFIG.stem, proc, tmp_path)  # as tests/test_shipped_configs.py would run it
    record = json.loads((tmp_path / "req0.json").read_text())
    assert record["audio_files"] == {"1": "req0.stage1.wav"}
    samples, rate = read_audio(tmp_path / "req0.stage1.wav")
    assert rate == 24000
    assert_close_audio(torch.from_numpy(samples), oracle(prompt, seed=0))


@pytest.fixture(scope="module")
def entry_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedPipeline]:
    """The diffusion stage alone, as an entry stage: clients send codec ids directly."""
    cfg = tmp_path_factory.mktemp("cfg") / "tts_entry.yaml"
    cfg.write_text(
        "name: tts_entry\n"
        "stages:\n"
        "  - {id: 0, model: tiny-token2wav, kind: diffusion, final_output: true,\n"
        "     engine_args: {max_model_len: 4096}, diffusion: {max_batch: 4}}\n"
    )
    with serve(cfg) as served:
        yield served


def test_entry_stage_bad_input_and_deadline_fail_only_that_request(entry_pipeline: ServedPipeline) -> None:
    from omni_mp.client.omni_client import RequestError

    codes = torch.randint(0, 321, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    want = token2wav(resolve_model("tiny-token2wav"), codes, DiffusionParams(seed=5, speaker="Chelsie"))
    with settled_client(entry_pipeline.endpoint) as client:
        cases = [
            ({"prompt_token_ids": [1, 999, 2]}, "invalid_input", "codec id 999 out of range"),
            ({"prompt": "some text"}, "invalid_input", "takes codec ids"),
            ({"prompt_token_ids": list(range(300)) * 10, "deadline_s": 0.5}, "deadline_exceeded", "deadline"),
        ]
        for kwargs, code, text in cases:
            with pytest.raises(RequestError) as info:
                client.generate(**kwargs)
            assert info.value.event.code == code and text in info.value.event.message, info.value.event
        # The stage kept serving: a good request right after gives transformers' waveform.
        done = client.generate(prompt_token_ids=codes, sampling={0: SamplingParamsMsg(seed=5)}, deadline_s=300)
        assert_close_audio(done.outputs[0].audio, want)

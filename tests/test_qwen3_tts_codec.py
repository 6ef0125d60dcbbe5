"""Qwen3-TTS's 12 Hz codec decoder (omni_mp.models.qwen3_tts.codec_decoder) on the diffusion
engine's EngineCore, in-process, on the tiny CustomVoice checkpoint, against the qwen-tts 0.1.1
reference's `speech_tokenizer.decode` (its own venv, tests/qwen3_tts_oracle.py) on the same codes:
the codes the reference's talker made, and random ones.

Tolerances (samples in [-1, 1], rms ~0.1; measured on this CPU):
- one shot (one window, no cache) vs the reference: atol 1e-5 (observed 1.1e-6 on one sample of
  38400: the front sums the 15 acoustic codebooks before their projection, the reference after).
- streamed (one frame per step, any chunking) and batched vs the reference one shot: atol 2e-4
  (observed <= 1.4e-5 max abs): the transformer over cached keys and values, the convolutions
  over kept inputs, the pre_conv after the kept quantized frames; equal up to summation order.
- the decoder is causal with no look-ahead (docs/qwen3_tts.md): T frames give 1920 T samples and
  the first frame alone gives the first 1920; the streamed audio is compared over its whole
  length, joins included, so a click at a chunk edge would fail the bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_mp.engines.base import EngineInputError, Extension
from omni_mp.engines.diffusion.engine import DiffusionEngine
from omni_mp.engines.diffusion.params import DiffusionStageConfig, StreamingConfig
from omni_mp.models.registry import builtin_model
from tests.diffusion_driver import run, worker_streams
from tests.qwen3_tts_oracle import require_reference, run_reference

ONE_SHOT_ATOL = 1e-5
STREAM_ATOL = 2e-4
GROUPS = 16
FRAME = 1920
STREAMING = StreamingConfig(first_chunk=16, chunk=32, max_chunk=128, left_context=0, right_context=0, crossfade_ms=0.0)
LENGTHS = {"a": 1, "b": 3, "c": 8, "d": 17, "e": 26, "f": 12, "g": 5, "h": 2}
LONG = 626  # frames: three of the reference's 300-frame chunks (each after 25 frames of left context)


def random_codes(n: int, seed: int) -> np.ndarray:
    """[n frames, 16] codes, the reference's layout."""
    return np.random.default_rng(seed).integers(0, 128, size=(n, GROUPS), dtype=np.int64)


def ids_of(codes: np.ndarray) -> list[int]:
    """The talker's order: frame 0's groups 0..15, then frame 1's..."""
    return codes.reshape(-1).tolist()


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return builtin_model("tiny-qwen3-tts-custom-voice")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (codes [frames, 16], the reference's waveform): the reference talker's own codes
    (a preset voice with instructions) and random codes of every length in LENGTHS, and LONG."""
    require_reference()
    sets = {rid: random_codes(n, 100 + i) for i, (rid, n) in enumerate({**LENGTHS, "long": LONG}.items())}
    requests = [
        {
            "kind": "custom_voice",
            "text": "hello there, how are you?",
            "speaker": "vivian",
            "language": "english",
            "instruct": "speak slowly",
            "max_new_tokens": 21,
        },
        *({"kind": "decode", "codes": c.tolist()} for c in sets.values()),
    ]
    run = run_reference(model_dir, requests)
    assert run.report["errors"] == {}
    out = {"spoken": (run.codes[0], run.wavs[0])}
    out |= {rid: (c, run.wavs[i + 1]) for i, (rid, c) in enumerate(sets.items())}
    return out


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    cfg = DiffusionStageConfig(model_type="qwen3_tts_codec", streaming=STREAMING, max_batch=8, max_input_len=16384)
    eng = DiffusionEngine(str(model_dir), cfg, {"max_model_len": 4096}, open_inputs=True)
    yield eng
    eng.shutdown()


def test_one_shot_equals_the_reference(engine: DiffusionEngine, reference) -> None:
    codes, want = reference["spoken"]
    assert float(np.sqrt(np.mean(want**2))) > 0.03  # audible: the comparison means something
    audio, reasons, _ = run(engine, {"one": ids_of(codes)}, {"one": codes.size}, stream=False)
    assert reasons == {"one": "stop"} and len(audio["one"]) == 1
    torch.testing.assert_close(audio["one"][0], torch.from_numpy(want), atol=ONE_SHOT_ATOL, rtol=0)


@pytest.mark.parametrize("name", ["spoken", "a", "b", "d"])
def test_streamed_frame_by_frame_equals_the_reference(engine: DiffusionEngine, reference, name: str) -> None:
    codes, want = reference[name]
    audio, reasons, _ = run(engine, {name: ids_of(codes)}, {name: GROUPS})
    assert reasons == {name: "stop"}
    got = torch.cat(audio[name])
    assert got.shape == (codes.shape[0] * FRAME,) == want.shape
    torch.testing.assert_close(got, torch.from_numpy(want), atol=STREAM_ATOL, rtol=0)
    sizes = [a.numel() for a in audio[name]]
    assert sizes[:-1] == [STREAMING.chunk_at(k) // GROUPS * FRAME for k in range(len(sizes) - 1)], sizes


@pytest.mark.parametrize("stream", [False, True])
def test_past_300_frames_the_audio_is_the_references_chunked_decode(
    engine: DiffusionEngine, reference, stream: bool
) -> None:  # noqa: E501
    """The reference decodes 300 frames at a time, each chunk after 25 frames of left context
    on a fresh decoder (qwen-tts `chunked_decode`): one window or streamed 13 frames a step (windows
    across a chunk start), the audio equals it across both chunk starts (frames 300 and 600)."""
    codes, want = reference["long"]
    rate = {"long": codes.size if not stream else 13 * GROUPS}  # windows that straddle the chunk starts
    audio, reasons, _ = run(engine, {"long": ids_of(codes)}, rate, stream=stream)
    assert reasons == {"long": "stop"}
    got = torch.cat(audio["long"])
    assert got.shape == (LONG * FRAME,) == want.shape
    torch.testing.assert_close(got, torch.from_numpy(want), atol=STREAM_ATOL, rtol=0)
    assert not engine.model.tails or "long" not in engine.model.tails  # released with the request


def test_a_window_with_no_new_frames_gives_no_audio_and_the_stream_goes_on(engine: DiffusionEngine, reference) -> None:  # noqa: E501
    """A window of no frames (a request closed after its last window, as a talker that stops
    does on a GPU): no audio, no error; the request's audio is as before. (On an H200 such a
    window once killed the stage: torch.cat of no parts.)"""
    from omni_mp.models.qwen3_omni.code2wav import Code2WavWindow

    codes, want = reference["c"]
    model = engine.model
    frames = torch.from_numpy(codes).T.contiguous()  # [groups, frames]
    first = model.decode_windows([Code2WavWindow("empty", frames[:, :5], 0, 5)])[0]
    none = model.decode_windows([Code2WavWindow("empty", frames[:, 5:5], 5, 5)])[0]
    rest = model.decode_windows([Code2WavWindow("empty", frames[:, 5:], 5, frames.shape[1])])[0]
    model.release("empty")
    assert none.numel() == 0
    got = torch.cat([first, none, rest])
    torch.testing.assert_close(got, torch.from_numpy(want), atol=STREAM_ATOL, rtol=0)


def test_first_audio_comes_from_the_first_frame(engine: DiffusionEngine, reference) -> None:
    codes, want = reference["spoken"]
    ids = ids_of(codes)
    engine.submit("early", ids[:GROUPS], closed=False)
    outs, _ = engine.step()  # no look-ahead: one frame is enough
    (first,) = [o for o in outs if o.request_id == "early"]
    first_audio = torch.as_tensor(first.info["audio"])
    torch.testing.assert_close(first_audio, torch.from_numpy(want[:FRAME]), atol=STREAM_ATOL, rtol=0)
    engine.extend("early", Extension(input_ids=ids[GROUPS:], closed=True))
    audio, reasons, _ = run(engine, {}, {})
    assert reasons == {"early": "stop"}
    got = torch.cat([first_audio, *audio["early"]])
    torch.testing.assert_close(got, torch.from_numpy(want), atol=STREAM_ATOL, rtol=0)


def test_eight_batched_requests_each_equal_their_reference(engine: DiffusionEngine, reference) -> None:
    rates = {rid: GROUPS * (1 + i % 3) for i, rid in enumerate(LENGTHS)}  # 1 to 3 frames per step
    audio, reasons, batches = run(engine, {rid: ids_of(reference[rid][0]) for rid in LENGTHS}, rates)
    assert reasons == dict.fromkeys(LENGTHS, "stop")
    assert max(len(b) for b in batches) >= 4  # windows of several requests did share steps
    for rid in LENGTHS:
        want = torch.from_numpy(reference[rid][1])
        torch.testing.assert_close(torch.cat(audio[rid]), want, atol=STREAM_ATOL, rtol=0, msg=rid)
    assert not worker_streams(engine)  # every request's keys, values and kept inputs are gone


def test_out_of_range_code_is_refused_naming_it_and_others_go_on(engine: DiffusionEngine, reference) -> None:
    codes, want = reference["c"]
    engine.submit("good", ids_of(codes)[:GROUPS], closed=False)
    bad = ids_of(codes)
    bad[5] = 128  # past the codebook
    with pytest.raises(EngineInputError, match=r"code 128 out of range \[0, 128\)"):
        engine.submit("bad", bad, closed=True)
    engine.extend("good", Extension(input_ids=ids_of(codes)[GROUPS:], closed=True))
    audio, reasons, _ = run(engine, {}, {})
    assert reasons == {"good": "stop"}
    torch.testing.assert_close(torch.cat(audio["good"]), torch.from_numpy(want), atol=STREAM_ATOL, rtol=0)


def test_graphed_calls_padded_to_buckets_equal_the_reference(model_dir: Path, reference) -> None:
    """On a GPU the decoder's front and transformer run as one captured call per row bucket
    (frames padded to the longest streamed chunk, the cache to its full window, each row's
    pre_conv context an input) and its convolutions as Qwen3-Omni's: here the same padded calls
    run eagerly (tests/recording_graphs.py). Concurrent streams each equal their reference, and
    every padded call had a shape warmed up at start-up (no step waits for a capture)."""
    from tests.recording_graphs import RecordingGraphs

    cfg = DiffusionStageConfig(model_type="qwen3_tts_codec", streaming=STREAMING, max_batch=8)
    eng = DiffusionEngine(str(model_dir), cfg, {"max_model_len": 4096}, open_inputs=True)
    try:
        graphs = RecordingGraphs()
        eng.model.use_graphs(graphs, cfg.graph_batch_sizes)  # what the runner does on a GPU
        assert eng.model.warm_up_graphs(STREAMING, [8]) > 0
        names = ["spoken", "c", "d", "e", "f"]
        rates = {rid: GROUPS * (1 + i % 3) for i, rid in enumerate(names)}
        audio, reasons, batches = run(eng, {rid: ids_of(reference[rid][0]) for rid in names}, rates)
        assert reasons == dict.fromkeys(names, "stop")
        assert any(len(b) == 3 for b in batches), batches  # a 3-row step ran as a padded 4-row call
        for rid in names:
            want = torch.from_numpy(reference[rid][1])
            torch.testing.assert_close(torch.cat(audio[rid]), want, atol=STREAM_ATOL, rtol=0, msg=rid)
        for name, member in graphs.members.items():  # the front + transformer, the convolutions
            assert member.calls and set(member.calls) <= member.warmed, name
        calls = graphs.members["code2wav transformer"].calls
        assert any(call[0][1][0] == 4 for call in calls), calls  # rows padded to the bucket
        assert not worker_streams(eng)
    finally:
        eng.shutdown()

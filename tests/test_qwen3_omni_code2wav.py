"""Qwen3-Omni code2wav on the diffusion engine's EngineCore (a WindowDecoder: no solver), in-process,
on the tiny code2wav checkpoint, against transformers' `Qwen3OmniMoeCode2Wav.forward` one shot.

Tolerances (samples in [-1, 1], rms ~0.1; measured on this CPU):
- one shot (one window, no cache) vs transformers: atol 1e-6 (observed 0: bit-equal, the same
  modules; only the attention mask is built differently).
- streamed (any chunking, inputs arriving frame by frame) and batched vs transformers one
  shot: atol 2e-4 (observed <= 2.6e-5 max abs, 2.4e-5 relative L2, 1 to 150 frames). The
  transformer runs incrementally over cached keys and values and the convolutions over the
  inputs each request kept, so a chunk is the one-shot output up to float summation order; the
  random tiny weights amplify that order noise. In float64 the streamed convolutions are the
  one-shot ones to 1e-13 (bound 1e-10), whatever the chunking: the algorithm is exact.
  Controls that fail the bound by far: windows recomputed with no state from 25 frames of left
  context, as transformers' `chunked_decode` does (observed 0.36), and the convolutions' kept
  inputs zeroed between chunks (what a chunk run with no left context would see).
- joins: streamed audio is compared sample by sample over its whole length, boundaries
  included, so a click (a jump at a chunk edge) would fail the bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_mp.engines.base import EngineInputError, Extension
from omni_mp.engines.diffusion.engine import DiffusionEngine
from omni_mp.engines.diffusion.params import DiffusionStageConfig, StreamingConfig
from omni_mp.models.registry import builtin_model
from tests.diffusion_driver import run, worker_streams
from tests.recording_graphs import RecordingGraphs

ONE_SHOT_ATOL = 1e-6
STREAM_ATOL = 2e-4
GROUPS = 16
FRAME = 1920  # samples per frame
# One frame first (the first audio needs two: code2wav looks a third of a frame ahead), then 6.
# One frame first, then 2, 4, 8, 8, ... frames (growing chunks: `max_chunk`).
STREAMING = StreamingConfig(first_chunk=16, chunk=32, max_chunk=128, left_context=0, right_context=16, crossfade_ms=0.0)


@pytest.fixture(scope="module")
def c2w_dir() -> str:
    return str(builtin_model("tiny-qwen3-omni-code2wav"))


@pytest.fixture(scope="module")
def oracle(c2w_dir: str):
    """transformers' code2wav with the checkpoint's `code2wav.*` weights (read with safetensors)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    config = AutoConfig.from_pretrained(c2w_dir).code2wav_config
    model = Qwen3OmniMoeCode2Wav._from_config(config, dtype=torch.float32).eval()
    state = load_file(str(Path(c2w_dir) / "model.safetensors"))
    model.load_state_dict({k.removeprefix("code2wav."): v for k, v in state.items()}, strict=True)
    return model


@pytest.fixture(scope="module")
def engine(c2w_dir: str):
    cfg = DiffusionStageConfig(model_type="qwen3_omni_code2wav", streaming=STREAMING, max_batch=8)
    eng = DiffusionEngine(c2w_dir, cfg, {"max_model_len": 4096}, open_inputs=True)
    yield eng
    eng.shutdown()


def frames_of(n: int, seed: int) -> torch.Tensor:
    """[16, n] random codes (group g of frame f at [g, f])."""
    return torch.randint(0, 128, (GROUPS, n), generator=torch.Generator().manual_seed(seed))


def ids_of(codes: torch.Tensor) -> list[int]:
    """The talker's order: frame 0's groups 0..15, then frame 1's..."""
    return codes.T.reshape(-1).tolist()


@torch.no_grad()
def one_shot(oracle, codes: torch.Tensor) -> torch.Tensor:
    return oracle(codes[None])[0, 0]


@torch.no_grad()
def windowed(oracle, codes: torch.Tensor, start: int, left: int, size: int = 6) -> torch.Tensor:
    """Frames [start, start + size) recomputed from `left` frames before them and one after,
    with no state (what transformers' `chunked_decode` does, less its dropped chunk tails)."""
    a = max(0, start - left)
    end = min(codes.shape[1], start + size)
    wav = oracle(codes[None, :, a : end + 1])[0, 0]
    return wav[(start - a) * FRAME : (end - a) * FRAME]


def test_one_shot_equals_transformers(engine: DiffusionEngine, oracle) -> None:
    codes = frames_of(40, 1)
    audio, reasons, _ = run(engine, {"one": ids_of(codes)}, {"one": 40 * GROUPS}, stream=False)
    assert reasons == {"one": "stop"} and len(audio["one"]) == 1
    want = one_shot(oracle, codes)
    assert want.pow(2).mean().sqrt() > 0.03  # audible: the comparison means something
    torch.testing.assert_close(audio["one"][0], want, atol=ONE_SHOT_ATOL, rtol=0)


@pytest.mark.parametrize("frames", [1, 2, 9, 31], ids=lambda n: f"{n}-frames")
def test_streamed_frame_by_frame_equals_transformers_one_shot(engine: DiffusionEngine, oracle, frames: int) -> None:
    codes = frames_of(frames, frames)
    audio, reasons, _ = run(engine, {"s": ids_of(codes)}, {"s": GROUPS})
    assert reasons == {"s": "stop"}
    want = one_shot(oracle, codes)
    got = torch.cat(audio["s"])
    assert got.shape == want.shape == (frames * FRAME - 555,)
    torch.testing.assert_close(got, want, atol=STREAM_ATOL, rtol=0)
    if frames > 1:  # chunk sizes: one frame first, then the configured growing chunks
        sizes = [a.numel() for a in audio["s"]]
        assert sizes[:-1] == [STREAMING.chunk_at(k) // GROUPS * FRAME for k in range(len(sizes) - 1)], sizes
    assert not worker_streams(engine)  # the request's keys, values and history are gone


def test_first_audio_comes_from_the_first_two_frames(engine: DiffusionEngine, oracle) -> None:
    codes = frames_of(30, 5)
    ids = ids_of(codes)
    engine.submit("early", ids[:GROUPS], closed=False)
    assert not engine.can_step()  # one frame is not enough: its last third needs the next frame
    engine.extend("early", Extension(input_ids=ids[GROUPS : 2 * GROUPS], closed=False))
    outs, _ = engine.step()
    (first,) = [o for o in outs if o.request_id == "early"]
    want = one_shot(oracle, codes)
    torch.testing.assert_close(torch.as_tensor(first.info["audio"]), want[:FRAME], atol=STREAM_ATOL, rtol=0)
    engine.extend("early", Extension(input_ids=ids[2 * GROUPS :], closed=True))
    audio, reasons, _ = run(engine, {}, {})
    assert reasons == {"early": "stop"}
    torch.testing.assert_close(
        torch.cat([torch.as_tensor(first.info["audio"]), *audio["early"]]), want, atol=STREAM_ATOL, rtol=0
    )


def test_batched_requests_of_different_lengths_each_equal_their_oracle(engine: DiffusionEngine, oracle) -> None:
    lengths = {"a": 1, "b": 3, "c": 8, "d": 17, "e": 26, "f": 12, "g": 5, "h": 2}
    codes = {rid: frames_of(n, 100 + i) for i, (rid, n) in enumerate(lengths.items())}
    rates = {rid: GROUPS * (1 + i % 3) for i, rid in enumerate(lengths)}  # 1 to 3 frames per step
    audio, reasons, batches = run(engine, {rid: ids_of(c) for rid, c in codes.items()}, rates)
    assert reasons == dict.fromkeys(lengths, "stop")
    assert max(len(b) for b in batches) >= 4  # windows of several requests did share steps
    for rid, c in codes.items():
        torch.testing.assert_close(torch.cat(audio[rid]), one_shot(oracle, c), atol=STREAM_ATOL, rtol=0, msg=rid)
    assert not worker_streams(engine)


def test_controls_without_state_or_context_miss_the_bound(engine: DiffusionEngine, oracle, monkeypatch) -> None:
    """The bound is not vacuous: windows recomputed without the cached keys and values (from
    25 frames of left context, as transformers' `chunked_decode` does), or with the inputs the
    convolutions kept zeroed between chunks, both miss it by far."""
    from omni_mp.models.qwen3_omni.code2wav_convs import StreamingConvs

    codes = frames_of(60, 9)
    want = one_shot(oracle, codes)
    recomputed = torch.cat([windowed(oracle, codes, s, 25) for s in range(0, 60, 6)])
    assert recomputed.shape == want.shape
    assert (recomputed - want).abs().max() > 20 * STREAM_ATOL
    audio, _, _ = run(engine, {"ok": ids_of(codes)}, {"ok": GROUPS})
    assert (torch.cat(audio["ok"]) - want).abs().max() <= STREAM_ATOL

    run_kept = StreamingConvs.run

    def forgetful(self, hidden, kept):  # the worker runs in this process
        return run_kept(self, hidden, None if kept is None else torch.zeros_like(kept))

    monkeypatch.setattr(StreamingConvs, "run", forgetful)
    audio, _, _ = run(engine, {"short": ids_of(codes)}, {"short": GROUPS})
    got = torch.cat(audio["short"])
    assert got.shape == want.shape and (got - want).abs().max() > 20 * STREAM_ATOL


def convs_one_shot(hf, hidden: torch.Tensor) -> torch.Tensor:
    """transformers' upsampler and decoder (a `Qwen3OmniMoeCode2Wav`'s) over all of `hidden`
    [rows, channels, frames] at once: [rows, samples]."""
    x = hidden
    for module in [*(b for blocks in hf.upsample for b in blocks), *hf.decoder]:
        x = module(x)
    return x[:, 0]


@pytest.mark.parametrize("chunks", [[30], [1, 2, 4, 8, 15], [1] * 30, [7, 23]], ids=lambda c: "-".join(map(str, c[:6])))
def test_streamed_convolutions_equal_the_one_shot_stack_in_float64(oracle, chunks: list[int]) -> None:
    """The convolutional half alone, fed transformer outputs chunk by chunk, against
    transformers' upsampler and decoder on all of them at once, in float64: rounding aside
    (observed 4e-14), every chunking gives the one-shot samples, and a stream's first call
    gives 555 fewer than 1920 per frame, as the one-shot pass does."""
    import copy

    from omni_mp.models.qwen3_omni.code2wav_convs import StreamingConvs

    hf = copy.deepcopy(oracle).double()
    convs = StreamingConvs(hf)
    assert (convs.samples_per_frame, convs.first_trim) == (FRAME, 555)
    hidden = torch.randn(3, hf.config.hidden_size, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = convs_one_shot(hf, hidden)
        got, kept, start = [], None, 0
        for n in chunks:
            wav, kept = convs.run(hidden[..., start : start + n], kept)
            assert wav.shape[-1] == n * FRAME - (555 if start == 0 else 0)
            assert kept.shape == (3, convs.state_size)
            got.append(wav)
            start += n
    assert want.abs().max() > 0.1
    torch.testing.assert_close(torch.cat(got, dim=-1), want, atol=1e-10, rtol=0)


def test_streamed_convolutions_refuse_a_layout_they_do_not_know(oracle) -> None:
    """A convolution this streaming form has no rule for fails at load, not with wrong audio."""
    import copy

    from omni_mp.models.qwen3_omni.code2wav_convs import StreamingConvs

    strided = copy.deepcopy(oracle)
    strided.decoder[0].stride = 2
    with pytest.raises(ValueError, match="stride"):
        StreamingConvs(strided)
    padded = copy.deepcopy(oracle)
    padded.decoder[1].block[1].left_pad += 1
    with pytest.raises(ValueError, match="trimmed"):
        StreamingConvs(padded)


def test_bad_input_fails_only_that_request(engine: DiffusionEngine, oracle) -> None:
    codes = frames_of(20, 77)
    ids = ids_of(codes)
    engine.submit("good", ids[: 4 * GROUPS], closed=False)
    with pytest.raises(EngineInputError, match="code 128 out of range"):
        engine.submit("bad1", [1] * 15 + [128])
    engine.submit("bad2", [1] * GROUPS, closed=False)
    with pytest.raises(EngineInputError, match="code -1 out of range"):
        engine.extend("bad2", Extension(input_ids=[-1] * GROUPS, closed=False))
    engine.abort(["bad2"])  # what the stage loop does with a request whose input failed
    engine.submit("bad3", [3] * (2 * GROUPS + 5), closed=True)  # ends inside a frame
    outs, _ = engine.step()
    first = [torch.as_tensor(o.info["audio"]) for o in outs if o.request_id == "good"]
    engine.extend("good", Extension(input_ids=ids[4 * GROUPS :], closed=True))
    audio, reasons, _ = run(engine, {}, {})
    audio["good"] = first + audio["good"]
    assert reasons["bad3"] is not None and "16 codes per frame" in str(reasons["bad3"])
    assert reasons["good"] == "stop" and set(reasons) == {"good", "bad3"}
    torch.testing.assert_close(torch.cat(audio["good"]), one_shot(oracle, codes), atol=STREAM_ATOL, rtol=0)
    assert not worker_streams(engine)


def test_two_windows_of_one_request_in_one_call_run_in_order(engine: DiffusionEngine, oracle) -> None:
    """With `max_chunks_in_flight` > 1 a step may hold consecutive windows of one request: the
    decoder runs them in successive rounds (the second needs the first's keys and values)."""
    from omni_mp.engines.diffusion.model import Window

    model = engine.model  # the worker's model (the worker runs in this process)
    codes = frames_of(14, 21)
    ids = torch.tensor(ids_of(codes))
    spans = [(0, 1, 2), (1, 7, 8), (7, 14, 14)]  # emitted [s, e), window end (one frame of right context)
    windows = [model.condition(Window("two", ids[s * GROUPS : w * GROUPS], s * GROUPS, None)) for s, _, w in spans]
    other = model.condition(Window("other", ids[: 2 * GROUPS], 0, None))
    outs = model.decode_windows([windows[0], other, windows[1]]) + model.decode_windows([windows[2]])
    got = torch.cat([outs[0][:FRAME], outs[2][: 6 * FRAME], outs[3]])
    torch.testing.assert_close(got, one_shot(oracle, codes), atol=STREAM_ATOL, rtol=0)
    torch.testing.assert_close(outs[1][:FRAME], one_shot(oracle, codes[:, :2])[:FRAME], atol=STREAM_ATOL, rtol=0)
    model.release("two")
    model.release("other")


def shapes(keys) -> set[tuple]:
    """The argument shapes of graph keys (`graphs._signature`s; None for a None argument)."""
    return {tuple(None if k == ("v", None) else k[1] for k in key) for key in keys}


def test_graph_warm_up_captures_every_streamed_shape(c2w_dir: str) -> None:
    """The runner hands a window decoder its graphs and asks it, at start-up, for the shapes a
    stream's steps use: one transformer call per row bucket (frames padded to the longest
    streamed chunk, the cache to its full 71 frames) and one convolution call per (rows, new
    frames, first call) of the streamed chunk sizes."""
    from omni_mp.engines.diffusion.params import DiffusionParams
    from omni_mp.engines.diffusion.runner import DiffusionRunner
    from omni_mp.models.qwen3_omni.code2wav import Code2WavModel, streamed_shapes

    model = Code2WavModel.from_checkpoint(c2w_dir, torch.device("cpu"))
    graphs = RecordingGraphs()
    runner = DiffusionRunner(model, 0, graphs, graph_batch_sizes=(1, 2, 4, 8, 16))  # type: ignore[arg-type]
    warm = runner.warm_up_graphs(STREAMING, 8, DiffusionParams(seed=0))
    rows = (1, 2, 4, 8)
    assert streamed_shapes(STREAMING, GROUPS) == (8, [(2, True), (2, False), (4, False), (8, False)])
    layers, heads, head_dim = len(model.layers), model.heads, model.head_dim
    assert model.keep == model.sliding_window - 1
    assert shapes(graphs.members["code2wav transformer"].warmed) == {
        ((r, GROUPS, 8), (r,), (r,), (r,), (r, layers, 2, heads, model.keep, head_dim)) for r in rows
    }
    width, state = model.hf.config.hidden_size, model.convs.state_size
    assert shapes(graphs.members["code2wav convolutions"].warmed) == {
        ((r, width, n), None if first else (r, state))
        for r in rows
        for n, first in [(2, True), (2, False), (4, False), (8, False)]
    }
    assert warm.graphs == len(rows) * 5


def test_graphed_calls_padded_to_buckets_equal_transformers(c2w_dir: str, oracle) -> None:
    """Concurrent streams through the padded calls the graphs replay (rows to a bucket, the
    transformer's frames to the longest chunk and its cache to 71 frames): every request's
    audio equals its one-shot oracle within the streaming bound, and every padded call had a
    shape warmed up at start-up (so no step waits for a capture); the short last chunks, whose
    shapes were not warmed, ran eagerly."""
    cfg = DiffusionStageConfig(model_type="qwen3_omni_code2wav", streaming=STREAMING, max_batch=8)
    eng = DiffusionEngine(c2w_dir, cfg, {"max_model_len": 4096}, open_inputs=True)
    try:
        graphs = RecordingGraphs()
        eng.model.use_graphs(graphs, cfg.graph_batch_sizes)  # what the runner does on a GPU
        eng.model.warm_up_graphs(STREAMING, [8])
        lengths = {"a": 31, "b": 17, "c": 9, "d": 3, "e": 12}
        codes = {rid: frames_of(n, 300 + i) for i, (rid, n) in enumerate(lengths.items())}
        rates = {"a": GROUPS, "b": 3 * GROUPS, "c": GROUPS, "d": GROUPS, "e": 2 * GROUPS}
        audio, reasons, batches = run(eng, {rid: ids_of(c) for rid, c in codes.items()}, rates)
        assert reasons == dict.fromkeys(lengths, "stop")
        assert max(len(b) for b in batches) >= 3
        for rid, c in codes.items():
            torch.testing.assert_close(torch.cat(audio[rid]), one_shot(oracle, c), atol=STREAM_ATOL, rtol=0, msg=rid)
        for name, member in graphs.members.items():  # both halves
            assert member.calls and set(member.calls) <= member.warmed, name
        # rows padded: a step of 3 windows ran as a 4-row call
        assert any(len(b) == 3 for b in batches), batches
        assert any(shape[0][0] == 4 for shape in shapes(graphs.members["code2wav transformer"].calls))
        assert not worker_streams(eng)
    finally:
        eng.shutdown()


def test_a_streams_kept_state_is_its_own_not_a_view_of_its_batch(engine: DiffusionEngine) -> None:
    """After a batched step each stream keeps copies of its rows (the convolutions' kept inputs,
    its samples): a view would keep the whole batch's tensor alive while the stream waits for
    frames, and streams waiting since different steps would each keep one batch."""
    from omni_mp.engines.diffusion.model import Window

    model = engine.model  # the worker's model (the worker runs in this process)
    rids = [f"own{i}" for i in range(3)]
    wins = [Window(rid, torch.tensor(ids_of(frames_of(2, 40 + i))), 0, None) for i, rid in enumerate(rids)]
    model.decode_windows([model.condition(w) for w in wins])
    for rid in rids:
        st = model.streams[rid]
        for kept in (st.convs, st.samples, st.kv):
            assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size(), rid
        model.release(rid)

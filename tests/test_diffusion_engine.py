"""The diffusion engine (vLLM EngineCore + omni_mp's diffusion scheduler and worker), in-process,
on the tiny token2wav checkpoint, against transformers' own token2wav.

Tolerances:
- one shot vs transformers, and batched vs alone: atol 1e-5 on samples in [-1, 1] (observed
  <= 4e-7: the same fp32 operations; batching changes only matmul blocking).
- streamed vs one shot: relative L2 error <= 1e-3 and max abs error <= 5e-3 (observed 2e-5 and
  4e-4 with the default windows). A window sees less context than the one-shot pass, so it is
  not bit-equal; the control run without context is >= 10x worse, so the bound is not vacuous.
- clicks: at every chunk boundary, the largest sample-to-sample step of the streamed audio
  must not exceed the one-shot audio's 99.9th percentile step (a click is a jump larger than
  what the signal itself does).
"""

from __future__ import annotations

import copy

import pytest
import torch

from omni_mp.engines.base import EngineInputError, Extension
from omni_mp.engines.diffusion.batcher import Batcher, DiffusionRequest
from omni_mp.engines.diffusion.chunking import check_streaming
from omni_mp.engines.diffusion.engine import DiffusionEngine
from omni_mp.engines.diffusion.params import DiffusionParams, DiffusionStageConfig, StreamingConfig
from omni_mp.engines.diffusion.runner import DiffusionRunner
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
from tests.hf_oracle import token2wav
from tests.launcher import engine_is_empty

ATOL = 1e-5


@pytest.fixture(scope="module")
def t2w_dir() -> str:
    return str(build_token2wav(TOKEN2WAV_SPECS["tiny-token2wav"]))


@pytest.fixture(scope="module")
def engine(t2w_dir: str):
    eng = DiffusionEngine(t2w_dir, DiffusionStageConfig(max_batch=16), {"max_model_len": 4096})
    yield eng
    eng.shutdown()


def codes_of(n: int, seed: int) -> list[int]:
    return torch.randint(0, 321, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def drain(eng: DiffusionEngine, max_steps: int = 10_000) -> tuple[dict[str, list[torch.Tensor]], dict[str, str | None]]:
    """Step until idle: audio chunks and finish reason per request."""
    audio: dict[str, list[torch.Tensor]] = {}
    reasons: dict[str, str | None] = {}
    for _ in range(max_steps):
        if engine_is_empty(eng):
            return audio, reasons
        outs, _ = eng.step()
        for o in outs:
            if o.info is not None:
                audio.setdefault(o.request_id, []).append(o.info["audio"])
            if o.finished:
                reasons[o.request_id] = o.finish_reason
        reasons.update(eng.take_failed())
    raise AssertionError("engine did not go idle")


def alone(eng: DiffusionEngine, codes: list[int], p: DiffusionParams, stream: bool = False) -> torch.Tensor:
    eng.submit("alone", codes, p, stream=stream)
    audio, _ = drain(eng)
    return torch.cat(audio["alone"])


PARAMS = [
    DiffusionParams(seed=3, speaker="Ethan"),  # transformers' defaults: 10 steps, CFG 0.5, sway -1
    DiffusionParams(seed=11, speaker="Chelsie", num_steps=6, guidance_scale=0.0, sway_coefficient=None),
    DiffusionParams(seed=5, speaker="Chelsie", num_steps=4, guidance_scale=2.0),
]


@pytest.mark.parametrize("p", PARAMS, ids=["defaults", "no-cfg-linear", "strong-cfg"])
def test_one_shot_matches_transformers(engine: DiffusionEngine, t2w_dir: str, p: DiffusionParams) -> None:
    codes = codes_of(40, p.seed)
    ref = token2wav(t2w_dir, codes, p)
    got = alone(engine, codes, p)
    assert got.dtype == torch.float32 and got.shape == ref.shape == (40 * 480,)
    assert engine.sample_rate == 24000
    assert ref.std() > 0.01  # audible, so the comparison means something
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_batched_requests_equal_each_alone(engine: DiffusionEngine) -> None:
    reqs = {
        "a": (codes_of(17, 1), DiffusionParams(seed=1, speaker="Ethan")),
        "b": (codes_of(40, 2), DiffusionParams(seed=2, speaker="Chelsie", guidance_scale=0.0)),
        "c": (codes_of(64, 3), DiffusionParams(seed=3, speaker="Ethan", num_steps=7)),
        "d": (codes_of(29, 4), DiffusionParams(seed=4, speaker="Chelsie", solver="euler", num_steps=12)),
        "late": (codes_of(33, 5), DiffusionParams(seed=5, speaker="Ethan")),  # joins mid-way
    }
    expected = {rid: alone(engine, codes, p) for rid, (codes, p) in reqs.items()}
    for rid in ["a", "b", "c", "d"]:
        engine.submit(rid, *reqs[rid], stream=False)
    sizes = []
    for _ in range(3):
        engine.step()
        sizes.append(len(engine.batcher.running))
    engine.submit("late", *reqs["late"], stream=False)
    engine.step()
    sizes.append(len(engine.batcher.running))
    audio, reasons = drain(engine)
    assert sizes[0] == 4 and sizes[-1] == 5, sizes  # one batch, then the late one joined between steps
    assert reasons == {rid: "stop" for rid in reqs}
    for rid, want in expected.items():
        assert (torch.cat(audio[rid]) - want).abs().max() <= ATOL, rid


def _boundary_steps(wav: torch.Tensor, bounds: list[int], radius: int = 8) -> float:
    d = wav.diff().abs()
    return max(d[max(0, b - radius) : b + radius].max().item() for b in bounds)


def test_streamed_chunks_join_to_the_one_shot_waveform(engine: DiffusionEngine) -> None:
    n, p = 150, DiffusionParams(seed=9, speaker="Ethan")
    codes = codes_of(n, 9)
    one_shot = alone(engine, codes, p)
    # Upstream sends 7 codes per step; the first chunk starts as soon as its codes (and right
    # context) are in, and its audio comes one solve (num_steps - 1 steps) later.
    engine.submit("s", codes[:7], p, closed=False, stream=True)
    sent, chunks, steps, first_audio = 7, [], 0, None
    while not engine_is_empty(engine):
        if sent < n:
            engine.extend("s", Extension(input_ids=codes[sent : sent + 7], closed=sent + 7 >= n))
            sent += 7
        outs, _ = engine.step()
        steps += 1
        for o in outs:
            if o.info is not None and o.info["audio"].numel():
                chunks.append(o.info["audio"])
                first_audio = first_audio or (steps, sent)
    streamed = torch.cat(chunks)
    cfg = engine.cfg.streaming
    wait_steps = -(-(cfg.first_chunk + cfg.right_context - 7) // 7)
    assert first_audio is not None and first_audio[0] <= wait_steps + p.num_steps - 1 and first_audio[1] < n
    assert len(chunks) >= 3 and streamed.shape == one_shot.shape
    err = streamed - one_shot
    rel = (err.norm() / one_shot.norm()).item()
    assert rel <= 1e-3 and err.abs().max() <= 5e-3, (rel, err.abs().max())
    bounds, at = [], 0
    for c in chunks[:-1]:
        at += c.numel()
        bounds.append(at)
    assert _boundary_steps(streamed, bounds) <= one_shot.diff().abs().quantile(0.999).item()

    # Control: the same windows without context or crossfade are much further off.
    bare = StreamingConfig(left_context=0, right_context=0, crossfade_ms=0.0)
    batcher, runner = Batcher(16, bare), DiffusionRunner(engine.model, crossfade=0)
    batcher.add(DiffusionRequest("bare", engine.resolve(p), list(codes), closed=True, stream=True))
    parts = []
    while batcher.requests:
        for _, samples, _, _ in batcher.update(runner.execute(batcher.schedule())):
            parts.append(samples)
    bare_rel = ((torch.cat(parts) - one_shot).norm() / one_shot.norm()).item()
    assert bare_rel >= 10 * rel, (bare_rel, rel)


def test_chunks_of_one_request_solved_at_once_join_in_order(engine: DiffusionEngine) -> None:
    """max_chunks_in_flight > 1: with every code in at the start, all of a request's chunks start
    in the first step and finish together; their audio must come out in order, as the stream of
    one chunk at a time does, and as close to the one-shot waveform."""
    n, p = 150, DiffusionParams(seed=4, speaker="Chelsie", num_steps=4)
    codes = codes_of(n, 4)
    one_shot = alone(engine, codes, p)
    m, outputs = engine.model, dict[int, list[list[torch.Tensor]]]()
    for in_flight in (1, 64):
        cfg = StreamingConfig(max_chunks_in_flight=in_flight)
        batcher = Batcher(16, cfg)
        runner = DiffusionRunner(m, crossfade=check_streaming(cfg, m.window_align, m.samples_per_input, m.sample_rate))
        batcher.add(DiffusionRequest("r", engine.resolve(p), list(codes), closed=True, stream=True))
        steps: list[list[torch.Tensor]] = []
        while batcher.requests:
            steps.append([samples for _, samples, _, _ in batcher.update(runner.execute(batcher.schedule()))])
        outputs[in_flight] = steps
    chunked = [c for step in outputs[1] for c in step if c.numel()]
    together = [c for step in outputs[64] for c in step if c.numel()]
    assert len(chunked) >= 3 and len(together) == 1  # every chunk in one output, one solve long
    assert len(outputs[64]) == p.num_steps - 1 < len(outputs[1])  # num_steps time points: one solve
    streamed = torch.cat(chunked)
    assert torch.allclose(together[0], streamed, atol=ATOL)
    rel = ((together[0] - one_shot).norm() / one_shot.norm()).item()
    assert rel <= 1e-3, rel


def test_decoding_spans_equals_decoding_whole_windows(engine: DiffusionEngine) -> None:
    """Streaming decodes each solved window only around the chunk it emits (BigVGAN's reach,
    `decode_context`), not over the solver's whole context: the audio is the same."""
    model = engine.model
    assert model.decode_context is not None
    codes, p = codes_of(200, 4), engine.resolve(DiffusionParams(seed=4, speaker="Chelsie"))
    cfg, crossfade = engine.cfg.streaming, round(engine.cfg.streaming.crossfade_ms * model.sample_rate / 1000)

    def stream(m) -> tuple[torch.Tensor, list[int]]:
        frames: list[int] = []
        view = copy.copy(m)
        view.decode = lambda states: frames.extend(s.shape[0] for s in states) or m.decode(states)
        batcher, runner = Batcher(16, cfg), DiffusionRunner(view, crossfade=crossfade)
        batcher.add(DiffusionRequest("r", p, list(codes), closed=True, stream=True))
        parts = []
        while batcher.requests:
            for _, samples, _, _ in batcher.update(runner.execute(batcher.schedule())):
                parts.append(samples)
        return torch.cat(parts), frames

    whole_model = copy.copy(model)
    whole_model.decode_context = None
    spans, span_frames = stream(model)
    whole, whole_frames = stream(whole_model)
    assert spans.shape == whole.shape == (200 * model.samples_per_input,)
    assert (spans - whole).abs().max() <= 1e-6
    assert len(span_frames) == len(whole_frames) >= 4
    assert sum(span_frames) < sum(whole_frames)  # later chunks skip the solver's extra context


@pytest.fixture(scope="module")
def engine2(t2w_dir: str):
    eng = DiffusionEngine(t2w_dir, DiffusionStageConfig(max_batch=2), {"max_model_len": 4096})
    yield eng
    eng.shutdown()


def _worker_requests(eng: DiffusionEngine) -> set[str]:
    """Requests the worker holds state for (noise streams, trajectories)."""

    def probe(worker) -> set[str]:
        runner = worker.model_runner
        return set(runner.noise) | {t.request_id for t in runner.trajectories.values()}

    return eng.driver.core.collective_rpc(probe)[0]


def test_abort_mid_sampling_frees_the_slot(engine2: DiffusionEngine) -> None:
    p = DiffusionParams(seed=1, speaker="Ethan")
    codes = {rid: codes_of(20 + i, i) for i, rid in enumerate(["r1", "r2", "r3"])}
    want = {rid: alone(engine2, codes[rid], p) for rid in ["r2", "r3"]}
    for rid in ["r1", "r2", "r3"]:
        engine2.submit(rid, codes[rid], p, stream=False)
    engine2.step()
    engine2.step()
    assert sorted(engine2.batcher.running.values()) == ["r1", "r2"]  # r3 waits for a slot
    engine2.abort(["r1"])
    assert "r1" not in engine2.batcher.running.values()
    outs, _ = engine2.step()  # r3 takes the slot in the very next step
    assert sorted(engine2.batcher.running.values()) == ["r2", "r3"]
    assert "r1" not in _worker_requests(engine2)
    assert all(o.request_id != "r1" for o in outs)
    audio, reasons = drain(engine2)
    assert reasons == {"r2": "stop", "r3": "stop"}
    for rid in ["r2", "r3"]:
        torch.testing.assert_close(torch.cat(audio[rid]), want[rid], atol=ATOL, rtol=0)
    assert not _worker_requests(engine2)


def test_bad_input_fails_only_that_request(engine: DiffusionEngine) -> None:
    good_codes, p = codes_of(30, 7), DiffusionParams(seed=7, speaker="Chelsie")
    want = alone(engine, good_codes, p)
    engine.submit("good", good_codes, p, stream=False)
    engine.step()
    with pytest.raises(EngineInputError, match="unknown speaker 'Nobody'"):
        engine.submit("bad1", [1, 2, 3], DiffusionParams(seed=1, speaker="Nobody"))
    with pytest.raises(EngineInputError, match="codec id 999 out of range"):
        engine.submit("bad2", [1, 999, 3], DiffusionParams(seed=1))
    with pytest.raises(EngineInputError, match="empty input"):
        engine.submit("bad3", [], DiffusionParams(seed=1))
    engine.submit("bad4", [1, 2], DiffusionParams(seed=1), closed=False, stream=True)
    with pytest.raises(EngineInputError, match="codec id -4 out of range"):
        engine.extend("bad4", Extension(input_ids=[3, -4], closed=True))
    engine.abort(["bad4"])  # what the stage loop does with a request whose input failed
    audio, reasons = drain(engine)
    assert reasons == {"good": "stop"}
    torch.testing.assert_close(torch.cat(audio["good"]), want, atol=ATOL, rtol=0)

"""CUDA-graph buckets of the diffusion engine, on the CPU parts: bucket padding of token2wav
(what the graphs replay) must leave the real rows' results as the unpadded eager pass's, the
vocoder's device forward must be transformers' BigVGAN forward, and a CPU runner stays eager.

Graph capture and replay themselves are CUDA-only: tests/gpu/test_token2wav_graphs.py
checks them on a GPU (graph == eager at the bucket shape, bit for bit, and the speed).
Here `EagerBuckets` stands in for the GraphSet's `wrap` (it returns the function itself), so
the runner pads every step to a bucket exactly as it does on a GPU, and runs it eagerly.

Tolerances (tiny token2wav, fp32, CPU): padded vs unpadded velocity of the real rows and
frames: atol 1e-5 (observed <= 2e-6: padded keys are masked out of the attention, only the
kernels' blocking differs); padded vs unpadded audio through the whole runner: atol 1e-5 (observed <= 5e-7);
vocoder: bit-equal (the same operations in the same order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from omni_mp.engines.diffusion.batcher import Batcher, DiffusionRequest, StepPlan, TrajectorySpec
from omni_mp.engines.diffusion.chunking import one_shot, streamed_window_lengths
from omni_mp.engines.diffusion.graphs import bucket, round_up
from omni_mp.engines.diffusion.model import Window
from omni_mp.engines.diffusion.params import DiffusionParams, StreamingConfig
from omni_mp.engines.diffusion.runner import DiffusionRunner
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel
from tests.recording_graphs import RecordingGraphs

ATOL = 1e-5


class EagerBuckets:
    """The runner's view of a GraphSet (`wrap`), with no graphs: the function as it is."""

    def __init__(self) -> None:
        self.wrapped: list[str] = []

    def wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        self.wrapped.append(name)
        return fn


def load() -> Token2WavModel:
    return Token2WavModel.from_checkpoint(build_token2wav(TOKEN2WAV_SPECS["tiny-token2wav"]), torch.device("cpu"))


@pytest.fixture(scope="module")
def model() -> Token2WavModel:
    return load()


def window(model: Token2WavModel, rid: str, n: int, seed: int, **params: Any) -> Window:
    ids = torch.randint(0, model.num_codes - 1, (n,), generator=torch.Generator().manual_seed(seed))
    p = DiffusionParams(seed=seed, speaker=params.pop("speaker", "Chelsie"), **params)
    return Window(request_id=rid, ids=ids, start=0, params=p)


def test_bucket_helpers() -> None:
    assert [bucket(n, (1, 2, 4, 8)) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    assert [round_up(n, 24) for n in (1, 24, 25, 72)] == [24, 24, 48, 72]


def test_padded_collate_leaves_real_rows_as_unpadded(model: Token2WavModel) -> None:
    """Rows of different lengths, one without CFG: the bucket (rows 8, frames rounded up to
    attention blocks + one more block) gives the real rows the unpadded pass's velocity."""
    wins = [
        window(model, "a", 36, 1),
        window(model, "b", 50, 2, speaker="Ethan"),
        window(model, "c", 13, 3, guidance_scale=0.0),
    ]
    conds = [model.condition(w) for w in wins]
    guidance = torch.tensor([w.params.guidance_scale for w in wins])
    n, s = len(conds), max(c.frames for c in conds)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, s, model.state_dim, generator=gen)
    t = torch.rand(n, generator=gen)
    want = model.velocity(model.collate(conds, guidance), x, t)

    rows, frames = 8, round_up(s, model.graph_frame_step) + model.graph_frame_step
    xp = torch.randn(rows, frames, model.state_dim, generator=gen)  # padding holds anything finite
    xp[:n, :s] = x
    tp = torch.rand(rows, generator=gen)
    tp[:n] = t
    batch = model.collate(conds, guidance, pad_to=(rows, frames))
    assert batch.all_cfg and batch.code_embed.shape[:2] == (2 * rows, frames)
    got = model.velocity(batch, xp, tp)
    assert got.shape == xp.shape
    for i, c in enumerate(conds):
        diff = (got[i, : c.frames] - want[i, : c.frames]).abs().max().item()
        assert diff <= ATOL, (i, diff)
    with pytest.raises(ValueError, match="pad_to"):
        model.collate(conds, guidance, pad_to=(2, frames))


def test_vocoder_device_forward_is_transformers_bigvgan(model: Token2WavModel) -> None:
    mel = torch.randn(3, model.state_dim, 40, generator=torch.Generator().manual_seed(4)) - 4.0
    want = model.vocoder(mel)  # transformers' forward: [3, samples] on the CPU
    got = model._vocode(mel)
    assert got.shape == want.shape and torch.equal(got, want)


def run(runner: DiffusionRunner, wins: list[Window]) -> dict[str, torch.Tensor]:
    specs = [TrajectorySpec(i, w, one_shot(w.ids.numel())) for i, w in enumerate(wins)]
    plan = StepPlan(new=specs, step_ids=[s.traj_id for s in specs], freed=[], total_num_scheduled_tokens=len(specs))
    out: dict[str, torch.Tensor] = {}
    for _ in range(100):
        result = runner.execute(plan)
        assert not result.errors
        for rid, (samples, last) in result.outputs.items():
            assert last
            out[rid] = samples
        live = [t for t in plan.step_ids if t not in result.done]
        if not live:
            return out
        plan = StepPlan(new=[], step_ids=live, freed=[], total_num_scheduled_tokens=len(live))
    raise AssertionError("trajectories did not finish")


def test_runner_bucket_padding_gives_the_eager_audio() -> None:
    """The whole runner padded to buckets (as on a GPU with graphs) vs eager at each step's
    own size: the same audio per request, rows of different lengths, steps and guidance."""
    model = load()  # its own: the padded runner hands the model its graph set
    wins = [
        window(model, "a", 30, 5, num_steps=5),
        window(model, "b", 47, 6, num_steps=4, guidance_scale=0.0, speaker="Ethan"),
        window(model, "c", 12, 7, num_steps=6, solver="rk4"),
    ]
    eager = run(DiffusionRunner(model, crossfade=0), wins)
    buckets = EagerBuckets()
    padded_runner = DiffusionRunner(model, 0, buckets, graph_batch_sizes=(1, 2, 4, 8), graph_max_frames=512)  # type: ignore[arg-type]
    assert buckets.wrapped == ["velocity", "vocoder"]
    assert padded_runner.graph_shape(3, 94) == (4, 96)
    padded = run(padded_runner, wins)
    assert sorted(padded) == sorted(eager) == ["a", "b", "c"]
    for rid in eager:
        assert padded[rid].shape == eager[rid].shape
        diff = (padded[rid] - eager[rid]).abs().max().item()
        assert diff <= ATOL, (rid, diff)
    again = run(padded_runner, wins)  # the same trajectory ids again: nothing of the last run is reused
    assert all(torch.equal(again[rid], padded[rid]) for rid in padded)
    # past the largest bucket or the longest graphed state: eager at its own size
    assert padded_runner.graph_shape(9, 24) is None and padded_runner.graph_shape(1, 600) is None


def test_cpu_runner_stays_eager(model: Token2WavModel) -> None:
    runner = DiffusionRunner(model, crossfade=0)
    assert runner.graphs is None and runner.graph_shape(1, 24) is None
    assert runner._velocity == model.velocity and model._vocoder_rows is None


def stream(
    runner: DiffusionRunner, streaming: StreamingConfig, requests: list[tuple[Window, int]]
) -> dict[str, torch.Tensor]:
    """Stream each request's ids through a Batcher into `runner`, `per_step` ids arriving per
    step (the talker's rate is 1; more when it is ahead): the runner sees the windows,
    batches and last chunks a streaming stage gives it. Returns each request's audio."""
    batcher = Batcher(4, streaming)
    fed: dict[str, int] = {}
    for w, per_step in requests:
        ids = w.ids.tolist()
        fed[w.request_id] = min(per_step, len(ids))
        batcher.add(DiffusionRequest(w.request_id, w.params, ids[:per_step], per_step >= len(ids), stream=True))
    parts: dict[str, list[torch.Tensor]] = {w.request_id: [] for w, _ in requests}
    for _ in range(5000):
        if not batcher.requests:
            return {rid: torch.cat(p) for rid, p in parts.items()}
        for w, per_step in requests:
            rid, n = w.request_id, fed[w.request_id]
            if rid in batcher.requests and n < w.ids.numel():
                batcher.extend(rid, w.ids[n : n + per_step].tolist(), n + per_step >= w.ids.numel())
                fed[rid] = n + per_step
        for rid, samples, _, err in batcher.update(runner.execute(batcher.schedule())):
            assert err is None, err
            if samples is not None:
                parts[rid].append(samples)
    raise AssertionError("streams did not finish")


def test_start_up_warm_up_covers_every_streamed_step() -> None:
    """`warm_up_graphs` prepares the graph of every solver step streamed requests take (the
    same graph key: argument shapes, dtypes and devices), at every batch size up to
    max_batch, first and steady chunks, last chunks of odd lengths; the vocoder is graphed at
    the streamed window lengths only (others run eagerly). The audio is the eager runner's."""
    model = load()
    graphs = RecordingGraphs()
    streaming = StreamingConfig()
    runner = DiffusionRunner(model, 240, graphs, graph_batch_sizes=(1, 2, 4, 8), graph_max_frames=512)  # type: ignore[arg-type]
    eager_vocodes: list[int] = []
    vocode = model._vocode

    def counted(mel: torch.Tensor) -> torch.Tensor:  # the decode path for ungraphed lengths
        eager_vocodes.append(mel.shape[-1])
        return vocode(mel)

    model._vocode = counted  # type: ignore[method-assign]
    warm = runner.warm_up_graphs(streaming, 4, DiffusionParams(seed=0, speaker="Chelsie"))
    velocity, vocoder = graphs.members["velocity"], graphs.members["vocoder"]
    fpi, step = model.frames_per_input, model.graph_frame_step
    windows = streamed_window_lengths(streaming)
    # DiT: every frame bucket up to the longest window, at batch buckets 1, 2, 4 (max_batch 4);
    # vocoder: each streamed window length at those batch buckets.
    assert len(velocity.warmed) == len(range(step, round_up(max(windows) * fpi, step) + 1, step)) * 3
    assert len(vocoder.warmed) == len(windows) * 3
    assert warm.graphs == len(velocity.warmed) + len(vocoder.warmed) and not velocity.calls and not eager_vocodes

    lengths = [(30, 1), (47, 5), (100, 1), (161, 7), (9, 9), (75, 3)]
    reqs = [(window(model, f"r{i}", n, 40 + i, num_steps=3, speaker="Ethan" if i % 2 else "Chelsie"), per)
            for i, (n, per) in enumerate(lengths)]  # fmt: skip
    got = stream(runner, streaming, reqs)
    assert velocity.calls and set(velocity.calls) <= velocity.warmed  # no step would capture a graph
    assert vocoder.calls and set(vocoder.calls) <= vocoder.warmed
    odd = set(eager_vocodes)  # last chunks' own lengths: eager on their first use
    assert odd and not odd & {n * fpi for n in windows}
    want = stream(DiffusionRunner(load(), 240), streaming, reqs)
    for rid in want:
        assert got[rid].shape == want[rid].shape
        diff = (got[rid] - want[rid]).abs().max().item()
        assert diff <= ATOL, (rid, diff)
    # The same streams again: the odd lengths now go to the graphs (captured on this second use).
    eager_vocodes.clear()
    vocoder.calls.clear()
    again = stream(runner, streaming, reqs)
    assert not eager_vocodes and {c[0][1][2] for c in vocoder.calls} >= odd  # mel [rows, mel_dim, frames]
    assert all(torch.equal(again[rid], got[rid]) for rid in got)


def test_warm_up_plan_puts_every_streams_windows_first_within_max_graphs(model: Token2WavModel) -> None:
    """With fewer graphs than buckets, the first and steady windows' buckets come first."""
    runner = DiffusionRunner(model, 0, RecordingGraphs(max_graphs=5), graph_batch_sizes=(1, 2, 4))  # type: ignore[arg-type]
    plan = runner.warm_up_plan(StreamingConfig(), 4)
    first, steady = (
        round_up(n * model.frames_per_input, model.graph_frame_step) for n in streamed_window_lengths(StreamingConfig())
    )
    assert plan == [(1, first), (2, first), (4, first), (1, steady), (2, steady)]
    assert DiffusionRunner(model, 0).warm_up_plan(StreamingConfig(), 4) == []  # no graphs (CPU): nothing to warm

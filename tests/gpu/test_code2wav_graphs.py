"""Qwen3-Omni code2wav on one GPU with CUDA graphs against the same model eager, and both against
transformers' one-shot `Qwen3OmniMoeCode2Wav.forward` (was launch/gpu_code2wav_graphs_check.py):
N concurrent streams (1, 8, 32) of 40 frames fed chunk by chunk in lockstep (the stage's
chunking: one frame first, then 2, 4, 8 and 12 frames, each window one frame past what it
emits), per N the median step time eager and graphed and the largest sample difference. The
graphs are the diffusion runner's (`GraphSet`, warmed up as a stage does at start-up); the
eager model is a second copy of the same weights. Exact fp32, and TF32 (the shipped YAML's
setting). Needs no vLLM.

The script printed the differences without a bound; the test holds them, in exact fp32, to
FP32_ATOL (measured on an H200: graphed - eager 6.6e-5 to 7.4e-5, graphed - one shot 6.2e-5 to
7.8e-5: docs/results/qwen3_omni/code2wav_graphs_check_h200.json) and, in TF32, to TF32_ATOL (1.6e-2 to
2.2e-2 measured: ..._h200_tf32.json); and every graph captured at warm-up must be replayed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu

GROUPS, FRAME = 16, 1920
STREAMS, FRAMES = (1, 8, 32), 40
MODEL_DIR = Path("/tmp/omni_mp-code2wav-released")  # written once (~0.8 GB), as benchmarks.code2wav's
FP32_ATOL = 1e-3  # ~13x the largest difference measured in exact fp32
TF32_ATOL = 0.1  # ~5x the largest measured with TF32


def streaming() -> Any:
    """omni_mp/stage_configs/qwen3_omni.yaml's streaming."""
    from omni_mp.engines.diffusion.params import StreamingConfig

    return StreamingConfig(first_chunk=16, chunk=32, max_chunk=192, left_context=0, right_context=16, crossfade_ms=0.0)


def chunk_windows(frames: int) -> list[tuple[int, int, int]]:
    """A stream's windows: (start, emitted end, window end) in frames, as the stage cuts them
    (`chunking.next_chunk` over a stream whose codes have all arrived)."""
    from omni_mp.engines.diffusion.chunking import next_chunk

    out, emitted, k = [], 0, 0
    cfg = streaming()
    while emitted < frames * GROUPS:
        plan = next_chunk(cfg, k, emitted, frames * GROUPS, closed=True)
        assert plan is not None  # every code is known
        out.append((plan.window_start // GROUPS, plan.emit_end // GROUPS, plan.window_end // GROUPS))
        emitted, k = plan.emit_end, k + 1
    return out


def stream(model: Any, codes: list[torch.Tensor], tag: str) -> tuple[list[torch.Tensor], list[float]]:
    """All streams in lockstep, one decode_windows call a step: audio per stream, step times."""
    from omni_mp.models.qwen3_omni.code2wav import Code2WavWindow

    plans = [chunk_windows(c.shape[1]) for c in codes]
    audio: list[list[torch.Tensor]] = [[] for _ in codes]
    times = []
    for step in range(max(len(p) for p in plans)):
        now = [(i, p[step]) for i, p in enumerate(plans) if step < len(p)]
        windows = [Code2WavWindow(f"{tag}{i}", codes[i][:, s:w].to(model.device), s, w) for i, (s, _, w) in now]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = model.decode_windows(windows)  # CPU tensors: the step is done when they are
        times.append(time.perf_counter() - t0)
        for (i, (s, e, w)), out in zip(now, outs, strict=True):
            audio[i].append(out if e == w else out[: (e - s) * FRAME])
    for i in range(len(codes)):
        model.release(f"{tag}{i}")
    return [torch.cat(a) for a in audio], times


@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
def test_graphed_streams_match_eager_and_one_shot(tf32: bool, report: Callable[[dict[str, Any]], Path]) -> None:
    from omni_mp.engines.diffusion.graphs import GraphSet
    from omni_mp.engines.diffusion.params import DiffusionParams
    from omni_mp.engines.diffusion.runner import DiffusionRunner
    from omni_mp.models.qwen3_omni.code2wav import Code2WavModel
    from omni_mp.models.qwen3_omni.tiny_code2wav import write_released_code2wav

    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32  # the same both ways
    try:
        dev = torch.device("cuda:0")
        model_dir = write_released_code2wav(MODEL_DIR, device="cuda")
        eager = Code2WavModel.from_checkpoint(model_dir, dev)
        graphed = Code2WavModel.from_checkpoint(model_dir, dev)
        graphs = GraphSet(64)
        runner = DiffusionRunner(graphed, 0, graphs)
        warm = runner.warm_up_graphs(streaming(), max(STREAMS), DiffusionParams(seed=0))
        print(f"# {'TF32' if tf32 else 'exact fp32'}; {FRAMES} frames per stream; warm-up captured "
              f"{warm.graphs} graphs in {warm.seconds:.1f}s", flush=True)  # fmt: skip
        results = [one_count(eager, graphed, n, dev) for n in STREAMS]
        stats = graphs.stats()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    print(f"# graphs (captured, replays, eager calls): {stats}")
    report({"frames": FRAMES, "tf32": tf32, "warm_up": [warm.graphs, warm.seconds], "results": results,
            "graphs": stats})  # fmt: skip
    atol = TF32_ATOL if tf32 else FP32_ATOL
    worst = max(max(r["max_abs_graphed_eager"], r["max_abs_graphed_one_shot"]) for r in results)
    assert worst <= atol, results
    assert warm.graphs > 0 and all(replays > 0 for _captured, replays, *_ in stats.values()), stats


def one_count(eager: Any, graphed: Any, n: int, dev: torch.device) -> dict[str, Any]:
    """n streams through both models and transformers' one shot: step times, largest differences."""
    hf = eager.hf
    gen = torch.Generator().manual_seed(n)
    codes = [torch.randint(0, hf.config.codebook_size, (GROUPS, FRAMES), generator=gen) for _ in range(n)]
    stream(eager, codes, "warm")  # first-use costs (cuDNN plans) out of the timing
    a_eager, t_eager = stream(eager, codes, "e")
    a_graph, t_graph = stream(graphed, codes, "g")
    with torch.no_grad():
        want = hf(torch.stack(codes).to(dev))[:, 0].float().cpu()
    row = {
        "streams": n, "eager_ms": 1000 * statistics.median(t_eager), "graphed_ms": 1000 * statistics.median(t_graph),
        "max_abs_graphed_eager": max_abs(a_graph, a_eager),
        "max_abs_graphed_one_shot": max_abs(a_graph, want.unbind(0)),
    }  # fmt: skip
    print(f"| {n} | {row['eager_ms']:.1f} ms | {row['graphed_ms']:.1f} ms | {row['eager_ms'] / row['graphed_ms']:.1f}x "
          f"| {row['max_abs_graphed_eager']:.2e} | {row['max_abs_graphed_one_shot']:.2e} |", flush=True)  # fmt: skip
    return row


def max_abs(a: Any, b: Any) -> float:
    """The largest |a - b| over pairs of tensors."""
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))

"""Qwen3-Omni code2wav on one GPU with CUDA graphs against the same model eager, and both against
transformers' one-shot `Qwen3OmniMoeCode2Wav.forward`: N concurrent streams fed chunk by chunk
in lockstep (the stage's chunking: one frame first, then 2, 4, 8 and 12 frames, each window one
frame past what it emits), per N the median step time eager and graphed and the largest sample
difference. The graphs are the diffusion runner's (`GraphSet`, warmed up as a stage does at
start-up); the eager model is a second copy of the same weights.

Needs torch with CUDA, transformers, safetensors and msgspec (no vLLM):
  python3 launch/gpu_code2wav_graphs_check.py [--streams 1,8,32] [--frames 40] [--out DIR]
Writes code2wav_graphs_check.json to --out (default: the current dir).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_mp.engines.diffusion.chunking import next_chunk  # noqa: E402
from omni_mp.engines.diffusion.graphs import GraphSet  # noqa: E402
from omni_mp.engines.diffusion.params import DiffusionParams, StreamingConfig  # noqa: E402
from omni_mp.engines.diffusion.runner import DiffusionRunner  # noqa: E402
from omni_mp.models.qwen3_omni.code2wav import Code2WavModel, Code2WavWindow  # noqa: E402
from omni_mp.models.qwen3_omni.tiny_code2wav import write_released_code2wav  # noqa: E402

GROUPS, FRAME = 16, 1920
# omni_mp/stage_configs/qwen3_omni.yaml's streaming
STREAMING = StreamingConfig(first_chunk=16, chunk=32, max_chunk=192, left_context=0, right_context=16, crossfade_ms=0.0)


def chunk_windows(frames: int) -> list[tuple[int, int, int]]:
    """A stream's windows: (start, emitted end, window end) in frames, as the stage cuts them
    (`chunking.next_chunk` over a stream whose codes have all arrived)."""
    out, emitted, k = [], 0, 0
    while emitted < frames * GROUPS:
        plan = next_chunk(STREAMING, k, emitted, frames * GROUPS, closed=True)
        assert plan is not None  # every code is known
        out.append((plan.window_start // GROUPS, plan.emit_end // GROUPS, plan.window_end // GROUPS))
        emitted, k = plan.emit_end, k + 1
    return out


def stream(model: Code2WavModel, codes: list[torch.Tensor], tag: str) -> tuple[list[torch.Tensor], list[float]]:
    """All streams in lockstep, one decode_windows call a step: audio per stream, step times."""
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--dir", default="/tmp/omni_mp-code2wav-released")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions (the shipped YAML's setting)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32  # the same both ways
    dev = torch.device("cuda:0")
    counts = [int(x) for x in args.streams.split(",")]
    model_dir = write_released_code2wav(Path(args.dir), device="cuda")
    eager = Code2WavModel.from_checkpoint(model_dir, dev)
    graphed = Code2WavModel.from_checkpoint(model_dir, dev)
    graphs = GraphSet(64)
    runner = DiffusionRunner(graphed, 0, graphs)
    warm = runner.warm_up_graphs(STREAMING, max(counts), DiffusionParams(seed=0))
    print(
        f"# {torch.cuda.get_device_name(0)}; code2wav at the released sizes, fp32 "
        f"({'TF32' if args.tf32 else 'exact'}); "
        f"{args.frames} frames per stream; warm-up captured {warm.graphs} graphs in {warm.seconds:.1f}s",
        flush=True,
    )
    hf = eager.hf
    results = []
    print("| streams | step p50, eager | graphed | speed-up | max abs, graphed - eager | graphed - one shot |")
    print("|---|---|---|---|---|---|")
    for n in counts:
        gen = torch.Generator().manual_seed(n)
        codes = [torch.randint(0, hf.config.codebook_size, (GROUPS, args.frames), generator=gen) for _ in range(n)]
        stream(eager, codes, "warm")  # first-use costs (cuDNN plans) out of the timing
        a_eager, t_eager = stream(eager, codes, "e")
        a_graph, t_graph = stream(graphed, codes, "g")
        with torch.no_grad():
            want = hf(torch.stack(codes).to(dev))[:, 0].float().cpu()
        d_eager = max((g - e).abs().max().item() for g, e in zip(a_graph, a_eager, strict=True))
        d_once = max((g - w).abs().max().item() for g, w in zip(a_graph, want.unbind(0), strict=True))
        row = {
            "streams": n, "eager_ms": 1000 * statistics.median(t_eager),
            "graphed_ms": 1000 * statistics.median(t_graph),
            "max_abs_graphed_eager": d_eager, "max_abs_graphed_one_shot": d_once,
        }  # fmt: skip
        results.append(row)
        print(
            f"| {n} | {row['eager_ms']:.1f} ms | {row['graphed_ms']:.1f} ms "
            f"| {row['eager_ms'] / row['graphed_ms']:.1f}x "
            f"| {d_eager:.2e} | {d_once:.2e} |",
            flush=True,
        )
    stats = graphs.stats()
    print(f"# graphs (captured, replays, eager calls): {stats}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = {"device": torch.cuda.get_device_name(0), "frames": args.frames, "warm_up": [warm.graphs, warm.seconds],
           "results": results, "graphs": stats}  # fmt: skip
    out["tf32"] = args.tf32
    (args.out / f"code2wav_graphs_check{'_tf32' if args.tf32 else ''}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

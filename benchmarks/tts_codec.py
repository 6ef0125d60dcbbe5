"""Qwen3-TTS's codec decoder (omni_mp.models.qwen3_tts.codec_decoder) alone, as its stage runs it
(CUDA graphs over row buckets, the shipped streaming chunks), at the released sizes: the time of
one decoder call against how many requests it holds and how many frames each brings, in exact
fp32 and with TF32 tensor cores (`diffusion.float32_matmul`), with SnakeBeta as transformers'
kernels or as one Triton kernel (`diffusion.model_options.fused_snake`, the CUDA default), and the
kernels of one call. Every combination runs in the same process, one after the other.

The served pipeline's step timeline (OMNI_MP_PROFILE_DIR) showed the decoder stage's step
growing with its requests (one H200, fp32: 9 ms at 1, 46 ms at 10): this says what one call
costs, so the stage's chunking and precision can be chosen from numbers.

    python -m benchmarks.tts_codec --dir /tmp/qwen3_tts_gpu        (one GPU; the checkpoint is
        written there once: benchmarks.common.checkpoints.qwen3_tts_released_dir)
    python -m benchmarks.tts_codec --dir /tmp/qwen3_tts_gpu --precisions high --snake eager,triton
    python -m benchmarks.tts_codec --dir /tmp/q3tts --batches 1,2 --precisions highest  (CPU)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common.checkpoints import qwen3_tts_released_dir  # noqa: E402
from benchmarks.common.phases import device_name, int_list  # noqa: E402
from omni_mp.engines.diffusion.graphs import DEFAULT_BATCH_SIZES, GraphSet, buckets_upto  # noqa: E402
from omni_mp.engines.diffusion.params import DiffusionStageConfig, StreamingConfig  # noqa: E402
from omni_mp.models.qwen3_omni.code2wav import Code2WavWindow  # noqa: E402
from omni_mp.models.qwen3_tts.codec_decoder import TtsCodecDecoder  # noqa: E402

GROUPS = 16
# the shipped stage_configs/qwen3_tts.yaml decoder chunks (in codes): 1 frame, then 2, 4, 8, 12
SHIPPED = StreamingConfig(first_chunk=16, chunk=32, max_chunk=192, left_context=0, right_context=0, crossfade_ms=0.0)


def decoder(model_dir: Path, device: torch.device, precision: str, max_batch: int, snake: str) -> TtsCodecDecoder:
    """The decoder with the stage's precision settings and graphs (engines.diffusion.vllm_hooks)."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = precision == "high"
    model = TtsCodecDecoder.from_checkpoint(model_dir, device, fused_snake=snake == "triton")
    if device.type == "cuda":
        model.use_graphs(GraphSet(DiffusionStageConfig().max_graphs), DEFAULT_BATCH_SIZES)
        model.warm_up_graphs(SHIPPED, buckets_upto(max_batch, DEFAULT_BATCH_SIZES))
    return model


def chunk_calls(model: TtsCodecDecoder, b: int, chunks: int, seed: int) -> list[float]:
    """`b` requests streamed together, chunk after chunk (SHIPPED's sizes): ms of each call."""
    gen = torch.Generator().manual_seed(seed)
    ids = [f"b{b}-{seed}-{i}" for i in range(b)]
    start, times = 0, []
    for k in range(chunks):
        n = SHIPPED.chunk_at(k) // GROUPS
        wins = [
            Code2WavWindow(r, torch.randint(0, model.codebook_size, (GROUPS, n), generator=gen).to(model.device),
                           start, start + n)
            for r in ids
        ]  # fmt: skip
        sync(model.device)
        t0 = time.perf_counter()
        model.decode_windows(wins)  # its audio comes back on the CPU: the call ends synchronized
        times.append((time.perf_counter() - t0) * 1000)
        start += n
    for r in ids:
        model.release(r)
    return times


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def kernels(model: TtsCodecDecoder, b: int, top: int) -> list[str]:
    """The CUDA kernels of one steady (12-frame) call of `b` requests: the busiest `top`."""
    from torch.profiler import ProfilerActivity, profile

    chunk_calls(model, b, 6, seed=7)  # the shapes warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        chunk_calls(model, b, 6, seed=8)
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) / 1000
    lines = [f"6 calls (chunks 1, 2, 4, 8, 12, 12 frames) of {b} requests: {total:.1f} ms of kernels"]
    lines += [f"  {e.device_time_total / 1000:7.2f} ms {e.count:6d}x  {e.key[:90]}" for e in events[:top]]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, required=True, help="work dir of the released-size checkpoint")
    p.add_argument("--batches", type=int_list, default=[1, 4, 10, 20, 32])
    p.add_argument("--precisions", default="highest,high", help="float32 matmul precisions (`high`: TF32)")
    p.add_argument(
        "--snake", default=None, help="SnakeBeta as transformers' kernels / one Triton kernel (CUDA: both, CPU: eager)"
    )
    p.add_argument("--rounds", type=int, default=3, help="runs of each batch; the median call kept")
    p.add_argument("--profile-batch", type=int, default=10, help="0: no kernel table")
    args = p.parse_args()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model_dir = qwen3_tts_released_dir(args.dir)
    chunks = [SHIPPED.chunk_at(k) // GROUPS for k in range(6)]
    print(f"# {device_name()}; Qwen3-TTS 12 Hz decoder at the released sizes (random weights), fp32 weights")
    print(f"# calls: every request brings the same chunk; chunks {chunks} frames (80 ms of audio a frame)")
    snakes = (args.snake or ("eager,triton" if device.type == "cuda" else "eager")).split(",")
    for precision, snake in [(p, s) for p in args.precisions.split(",") for s in snakes]:
        model = decoder(model_dir, device, precision, max(args.batches), snake)
        print(f"\n## float32_matmul {precision}, SnakeBeta {snake}: ms per call (median of {args.rounds}), "
              "by frames per request")  # fmt: skip
        print("| requests | " + " | ".join(f"{n} fr" for n in chunks) + " | ms per request-frame (12 fr) |")
        print("|---|" + "---|" * (len(chunks) + 1))
        for b in args.batches:
            chunk_calls(model, b, len(chunks), seed=0)  # unmeasured: first replays, allocator
            runs = [chunk_calls(model, b, len(chunks), seed=1 + r) for r in range(args.rounds)]
            med = [statistics.median(r[k] for r in runs) for k in range(len(chunks))]
            per = med[-1] / (b * chunks[-1])
            print(f"| {b} | " + " | ".join(f"{m:.2f}" for m in med) + f" | {per:.3f} |", flush=True)
        if args.profile_batch and device.type == "cuda":
            print("\n".join(kernels(model, args.profile_batch, 12)), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

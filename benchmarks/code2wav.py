"""Qwen3-Omni code2wav on the diffusion engine (a WindowDecoder on vLLM's EngineCore: windows
batched across requests, streamed with cached keys/values) vs transformers'
`Qwen3OmniMoeCode2Wav.forward` one shot, on the same weights and device, measured side by side.

1. Throughput: `b` requests of `--frames` frames (16 codes each, 80 ms of audio), all codes
   present; real-time factor (compute seconds per second of audio) of the engine streaming
   (the stage's chunking), the engine one shot (one window per request, batched), and
   transformers one shot, one request after another and as one batch (equal lengths, so
   transformers can batch them); ratios to transformers one after another.
2. Streaming latency: `c` requests whose frames arrive one per step; time from a request's
   second frame (what its first chunk needs) to its first audio, median and max.

The "streamed / one shot" column is what streaming costs on top of one window per request: the
chunks' recomputed work (the first chunk of each request runs apart from later ones).

CPU (tiny checkpoint):  python -m benchmarks.code2wav
CPU, released sizes:    python -m benchmarks.code2wav --released --frames 25 --batches 1,4 --concurrency 1
One GPU (the released code2wav sizes, random weights; written once, about 0.8 GB):
                        python -m benchmarks.code2wav --gpu [--dir /tmp/code2wav-released]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from omni_mp.engines.base import Extension  # noqa: E402
from omni_mp.engines.diffusion.engine import DiffusionEngine  # noqa: E402
from omni_mp.engines.diffusion.params import DiffusionStageConfig, StreamingConfig  # noqa: E402

GROUPS = 16
FRAME_S = 0.08


def _frames(n: int, codebook: int, seed: int) -> torch.Tensor:
    return torch.randint(0, codebook, (GROUPS, n), generator=torch.Generator().manual_seed(seed))


def _ids(codes: torch.Tensor) -> list[int]:
    return codes.T.reshape(-1).tolist()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_engine(eng: DiffusionEngine, reqs: list[torch.Tensor], stream: bool) -> float:
    t0 = time.perf_counter()
    for i, codes in enumerate(reqs):
        eng.submit(f"r{i}", _ids(codes), stream=stream)
    while eng.batcher.num_unfinished():
        eng.step()
        if failed := eng.take_failed():
            raise RuntimeError(f"failed: {failed}")
    return time.perf_counter() - t0


def check_stream(eng: DiffusionEngine, hf: torch.nn.Module, codes: torch.Tensor, device: torch.device) -> str:
    """The engine's streamed audio of one request against transformers' one shot, on this device."""
    eng.submit("check", _ids(codes), stream=True)
    chunks = []
    while eng.batcher.num_unfinished():
        outs, _ = eng.step()
        chunks += [torch.as_tensor(o.info["audio"]) for o in outs if o.info is not None]
    got = torch.cat(chunks)
    with torch.no_grad():
        want = hf(codes[None].to(device))[0, 0].float().cpu()
    err = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
    return f"streamed vs transformers one shot: max abs error {err:.2e} (audio rms {want.pow(2).mean().sqrt():.3f})"


def run_hf(model: torch.nn.Module, reqs: list[torch.Tensor], device: torch.device, batched: bool) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        if batched:
            model(torch.stack(reqs).to(device)).cpu()
        else:
            for codes in reqs:
                model(codes[None].to(device)).cpu()
    _sync(device)
    return time.perf_counter() - t0


def first_audio(eng: DiffusionEngine, reqs: list[torch.Tensor]) -> list[float]:
    """Frames arrive one per step per request; seconds from each request's second frame to its first audio."""
    ids = [_ids(c) for c in reqs]
    fed = [2 * GROUPS] * len(reqs)
    t_ready = {}
    for i in range(len(reqs)):
        eng.submit(f"s{i}", ids[i][: fed[i]], closed=False)
        t_ready[f"s{i}"] = time.perf_counter()
    first: dict[str, float] = {}
    while eng.batcher.num_unfinished():
        for i in range(len(reqs)):
            if fed[i] < len(ids[i]):
                eng.extend(
                    f"s{i}",
                    Extension(input_ids=ids[i][fed[i] : fed[i] + GROUPS], closed=fed[i] + GROUPS >= len(ids[i])),
                )
                fed[i] += GROUPS
        if not eng.can_step():
            continue
        outs, _ = eng.step()
        now = time.perf_counter()
        for o in outs:
            if o.info is not None and o.info["audio"].numel():
                first.setdefault(o.request_id, now - t_ready[o.request_id])
        if failed := eng.take_failed():
            raise RuntimeError(f"failed: {failed}")
    return list(first.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="one GPU, code2wav at the released sizes")
    ap.add_argument("--released", action="store_true", help="the released sizes on the CPU (--gpu implies them)")
    ap.add_argument("--dir", default="/tmp/omni_mp-code2wav-released", help="--gpu: where the released-size dir goes")
    ap.add_argument("--frames", type=int, default=0, help="frames per request (default: 150 on GPU, 25 on CPU)")
    ap.add_argument(
        "--batches", default="", help="default: 1,8,32 on GPU (64 one-shot requests of 150 frames need ~40 GB)"
    )
    ap.add_argument("--concurrency", default="")
    ap.add_argument("--max-batch", type=int, default=64, help="windows per engine step")
    ap.add_argument("--first-chunk", type=int, default=1, help="frames")
    ap.add_argument("--chunk", type=int, default=12, help="frames")
    ap.add_argument(
        "--max-chunk", type=int, default=0, help="frames: later chunks double from --chunk up to this (0: off)"
    )
    ap.add_argument("--tf32", action="store_true", help="float32_matmul: high (TF32) for the engine and transformers")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; best kept")
    args = ap.parse_args()
    device = torch.device("cuda:0" if args.gpu else "cpu")
    frames = args.frames or (150 if args.gpu else 25)
    batches = [int(x) for x in (args.batches or ("1,8,32" if args.gpu else "1,4")).split(",")]
    concurrency = [int(x) for x in (args.concurrency or ("1,8,32,64" if args.gpu else "1,4")).split(",")]
    if args.gpu or args.released:
        from omni_mp.models.qwen3_omni.tiny_code2wav import write_released_code2wav

        model_dir = str(write_released_code2wav(Path(args.dir), device=device.type))
        what = "code2wav at the released sizes (216M parameters, random weights), fp32"
    else:
        from omni_mp.models.registry import builtin_model

        model_dir = str(builtin_model("tiny-qwen3-omni-code2wav"))
        what = "tiny code2wav, fp32"
    streaming = StreamingConfig(
        first_chunk=args.first_chunk * GROUPS, chunk=args.chunk * GROUPS, max_chunk=args.max_chunk * GROUPS,
        left_context=0, right_context=GROUPS, crossfade_ms=0.0,
    )  # fmt: skip
    precision = "high" if args.tf32 else "highest"
    cfg = DiffusionStageConfig(
        model_type="qwen3_omni_code2wav", streaming=streaming, max_batch=args.max_batch, float32_matmul=precision
    )
    eng = DiffusionEngine(model_dir, cfg, {"max_model_len": 4096}, open_inputs=True)
    from omni_mp.models.qwen3_omni.code2wav import Code2WavModel

    hf = Code2WavModel.from_checkpoint(model_dir, device).hf  # transformers' module, the same weights
    codebook = hf.config.codebook_size
    audio_s = frames * FRAME_S
    where = torch.cuda.get_device_name(0) if args.gpu else f"CPU ({os.cpu_count()} cores)"
    print(f"# {where}; {what}; matmul {precision}; {frames} frames = {audio_s:.2f} s of audio per request")
    print(
        f"# streaming: first chunk {args.first_chunk} frame(s), then {args.chunk}"
        + (f", doubling up to {args.max_chunk}" if args.max_chunk else "")
        + f"; max {args.max_batch} windows a step"
    )

    print(f"# {check_stream(eng, hf, _frames(frames, codebook, 98), device)}")
    print("# warm-up: every batch size and every level runs once unmeasured (each way) before it is measured")
    throughput(eng, hf, device, batches, frames, codebook, args.rounds)
    latency(eng, concurrency, frames, codebook, args.rounds)
    eng.shutdown()


def throughput(
    eng: DiffusionEngine, hf: torch.nn.Module, device: torch.device, batches: list[int], frames: int, codebook: int,
    rounds: int,
) -> None:  # fmt: skip
    """The RTF table: per batch, every way after an unmeasured run of that batch, best of `rounds`."""
    audio_s = frames * FRAME_S
    print("\n| requests | engine streamed RTF | engine one-shot RTF | transformers one by one RTF "
          "| transformers batched RTF | streamed vs one by one | one-shot vs one by one "
          "| streamed / one shot |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for b in batches:
        reqs = [_frames(frames, codebook, i) for i in range(b)]
        warm = [_frames(frames, codebook, 500 + i) for i in range(b)]  # the batch's shapes, first runs
        run_engine(eng, warm, stream=True)
        run_engine(eng, warm, stream=False)
        run_hf(hf, warm, device, batched=False)
        run_hf(hf, warm, device, batched=True)
        best = dict.fromkeys(("stream", "once", "hf", "hf_b"), float("inf"))
        for _ in range(rounds):  # alternating, best of: other load on the host shows as noise
            best["stream"] = min(best["stream"], run_engine(eng, reqs, stream=True))
            best["once"] = min(best["once"], run_engine(eng, reqs, stream=False))
            best["hf"] = min(best["hf"], run_hf(hf, reqs, device, batched=False))
            best["hf_b"] = min(best["hf_b"], run_hf(hf, reqs, device, batched=True))
        rtf = {k: v / (b * audio_s) for k, v in best.items()}
        print(
            f"| {b} | {rtf['stream']:.4f} | {rtf['once']:.4f} | {rtf['hf']:.4f} | {rtf['hf_b']:.4f} "
            f"| {best['hf'] / best['stream']:.2f}x | {best['hf'] / best['once']:.2f}x "
            f"| {best['stream'] / best['once']:.2f} |"
        )


def latency(eng: DiffusionEngine, concurrency: list[int], frames: int, codebook: int, rounds: int) -> None:
    """The first-audio table: per level, after an unmeasured run of that level, best of `rounds`."""
    print("\n| concurrent streams | first audio after its 2nd frame, median (ms) | max (ms) |")
    print("|---|---|---|")
    for c in concurrency:
        reqs = [_frames(frames, codebook, 100 + i) for i in range(c)]
        first_audio(eng, [_frames(frames, codebook, 700 + i) for i in range(c)])  # the level's warm-up
        got: list[float] = []
        for _ in range(rounds):
            t = first_audio(eng, reqs)
            if not got or statistics.median(t) < statistics.median(got):
                got = t
        print(f"| {c} | {1000 * statistics.median(got):.1f} | {1000 * max(got):.1f} |")


if __name__ == "__main__":
    main()

"""token2wav on the diffusion engine (vLLM EngineCore + omni_mp's diffusion scheduler/worker) vs
transformers' token2wav run one request at a time, on the same checkpoint and device.

1. Throughput, one shot: `b` requests of `--codes` codes submitted at once (b in --batches);
   requests/s and real-time factor (compute seconds per second of audio; < 1 = faster than
   real time) for the engine and for transformers doing the same requests one after another,
   and their ratio.
2. Time to first audio chunk (streaming, default windows): `c` requests arriving at once
   (c in --concurrency); median and max over the requests, and the median's ratio to c = 1.

On a GPU two engines run side by side: `eager` (cuda_graphs off) and `graphs` (the default:
each solver step padded to a batch/length bucket and replayed from a CUDA graph, the vocoder
too); the tables give both and their ratio. On a CPU only the eager engine runs.

CPU (tiny checkpoint):   python -m benchmarks.token2wav
One GPU (token2wav at transformers' default size, random weights; built once, ~1.7 GB):
                         python -m benchmarks.token2wav --gpu [--matmul high]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from omni_mp.engines.diffusion.engine import DiffusionEngine  # noqa: E402
from omni_mp.engines.diffusion.params import DiffusionParams, DiffusionStageConfig  # noqa: E402
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav  # noqa: E402


def _codes(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_engine(eng: DiffusionEngine, reqs: list[list[int]], stream: bool) -> tuple[float, dict[str, float]]:
    """Wall time until every request finished, and each request's time to its first audio."""
    t0 = time.perf_counter()
    for i, codes in enumerate(reqs):
        eng.submit(f"r{i}", codes, DiffusionParams(seed=i), stream=stream)
    first: dict[str, float] = {}
    while eng.batcher.num_unfinished():
        outs, _ = eng.step()
        now = time.perf_counter() - t0
        for o in outs:
            if o.info is not None and o.info["audio"].numel():
                first.setdefault(o.request_id, now)
        if failed := eng.take_failed():
            raise RuntimeError(f"failed: {failed}")
    return time.perf_counter() - t0, first


def run_hf(model: torch.nn.Module, reqs: list[list[int]], device: torch.device) -> float:
    spk = model.speaker_map["Chelsie"]
    cond, ref = spk["cond"].to(device).float(), spk["ref_mel"].to(device).float()
    t0 = time.perf_counter()
    with torch.no_grad():
        for i, codes in enumerate(reqs):
            torch.manual_seed(i)
            model.token2wav(torch.tensor([codes], device=device), conditioning=cond, reference_mel=ref)
    _sync(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="one GPU, token2wav at transformers' default size")
    ap.add_argument("--codes", type=int, default=200, help="codes per request (50 codes = 1 s of audio)")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--max-batch", type=int, default=16, help="trajectories per engine step")
    ap.add_argument("--rounds", type=int, default=2, help="alternating engine/transformers rounds; best kept")
    ap.add_argument("--matmul", choices=["highest", "high"], default="highest", help="float32_matmul (high: TF32)")
    args = ap.parse_args()
    device = torch.device("cuda:0" if args.gpu else "cpu")
    spec = TOKEN2WAV_SPECS["token2wav-default-size" if args.gpu else "tiny-token2wav"]
    model_dir = str(build_token2wav(spec))
    engines: dict[str, DiffusionEngine] = {}
    for name, graphs in (("eager", False), ("graphs", True)) if args.gpu else (("eager", False),):
        cfg = DiffusionStageConfig(max_batch=args.max_batch, cuda_graphs=graphs, float32_matmul=args.matmul)
        engines[name] = DiffusionEngine(model_dir, cfg, {"max_model_len": 4096})
    eng = engines["eager"]
    from transformers import Qwen2_5OmniForConditionalGeneration

    hf = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.token2wav.to(device)
    vocab = eng.model.num_codes
    audio_s = args.codes * eng.model.samples_per_input / eng.model.sample_rate
    where = torch.cuda.get_device_name(0) if args.gpu else f"CPU ({os.cpu_count()} cores)"
    print(
        f"# {where}; {spec_name(args.gpu)}; {args.codes} codes = {audio_s:.2f} s of audio per request; "
        f"float32_matmul {args.matmul}; engines: {', '.join(engines)}"
    )

    batches = [int(x) for x in args.batches.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    warm = [_codes(args.codes, vocab, 99)]
    run_hf(hf, warm, device)
    for e in engines.values():  # warm, and with graphs capture the buckets the runs below use
        run_engine(e, warm, stream=False)
        for b in batches:
            run_engine(e, [_codes(args.codes, vocab, 50 + i) for i in range(b)], stream=False)
        for c in levels:
            run_engine(e, [_codes(args.codes, vocab, 70 + i) for i in range(c)], stream=True)
    print("# warm-up: transformers one request; each engine one unmeasured run of every batch and level first")

    cols = " | ".join(f"{n} req/s | {n} RTF" for n in engines)
    ratio = " | graphs vs eager" if "graphs" in engines else ""
    print(f"\n| batch | {cols} | transformers req/s | transformers RTF | best vs transformers{ratio} |")
    print("|---|" + "---|" * (2 * len(engines) + 3 + bool(ratio)))
    for b in batches:
        reqs = [_codes(args.codes, vocab, i) for i in range(b)]
        t_eng = dict.fromkeys(engines, float("inf"))
        t_hf = float("inf")
        for _ in range(args.rounds):  # alternating, best of: other load on the host shows as noise
            for n, e in engines.items():
                t_eng[n] = min(t_eng[n], run_engine(e, reqs, stream=False)[0])
            t_hf = min(t_hf, run_hf(hf, reqs, device))
        cells = " | ".join(f"{b / t:.2f} | {t / (b * audio_s):.3f}" for t in t_eng.values())
        extra = f" | {t_eng['eager'] / t_eng['graphs']:.2f}x" if ratio else ""
        best = t_hf / min(t_eng.values())
        print(f"| {b} | {cells} | {b / t_hf:.2f} | {t_hf / (b * audio_s):.3f} | {best:.2f}x{extra} |")

    names = list(engines)
    heads = " | ".join(f"{n} first audio median (ms) | {n} max (ms)" for n in names)
    print(f"\n| concurrent requests | {heads}{' | graphs vs eager (median)' if ratio else ''} |")
    print("|---|" + "---|" * (2 * len(names) + bool(ratio)))
    for c in levels:
        reqs = [_codes(args.codes, vocab, 100 + i) for i in range(c)]
        meds: dict[str, float] = {}
        cells = []
        for n, e in engines.items():
            first: dict[str, float] = {}
            for _ in range(args.rounds):
                _, got = run_engine(e, reqs, stream=True)
                if not first or statistics.median(got.values()) < statistics.median(first.values()):
                    first = got
            meds[n] = statistics.median(first.values())
            cells.append(f"{1000 * meds[n]:.0f} | {1000 * max(first.values()):.0f}")
        extra = f" | {meds['eager'] / meds['graphs']:.2f}x" if ratio else ""
        print(f"| {c} | {' | '.join(cells)}{extra} |")
    for e in engines.values():
        e.shutdown()


def spec_name(gpu: bool) -> str:
    return "token2wav at transformers' default size (random weights)" if gpu else "tiny token2wav (0.45M)"


if __name__ == "__main__":
    main()

"""The streaming first-chunk length (`diffusion.streaming.first_chunk`, in codes) against the
one-shot waveform: what a shorter first chunk (earlier first audio) costs in fidelity.

For each first-chunk length, requests of --codes random codes are streamed through the
diffusion engine's scheduler and worker (`Batcher` + `DiffusionRunner`, what the vLLM engine
core runs, without it) and compared with the one-shot output of the same request (same seed,
same noise): max abs difference and SNR (dB) over the first chunk's samples and over the
whole waveform, and the upstream codes the first audio waits for (first chunk + right
context). The other windows keep their defaults.

    python -m benchmarks.first_chunk                 # CPU, tiny token2wav
    python -m benchmarks.first_chunk --gpu           # token2wav at transformers' default size
"""

from __future__ import annotations

import argparse
import math
import os
import time

import msgspec
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from omni_mp.engines.diffusion.batcher import Batcher, DiffusionRequest  # noqa: E402
from omni_mp.engines.diffusion.chunking import check_streaming  # noqa: E402
from omni_mp.engines.diffusion.params import DiffusionParams, StreamingConfig  # noqa: E402
from omni_mp.engines.diffusion.runner import DiffusionRunner  # noqa: E402
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav  # noqa: E402
from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel  # noqa: E402


def synthesize(model: Token2WavModel, cfg: StreamingConfig, reqs: list[list[int]], stream: bool) -> list[torch.Tensor]:
    crossfade = check_streaming(cfg, model.window_align, model.samples_per_input, model.sample_rate)
    batcher, runner = Batcher(max(1, len(reqs)), cfg), DiffusionRunner(model, crossfade)
    for i, codes in enumerate(reqs):
        p = DiffusionParams(seed=i, speaker="Chelsie")
        batcher.add(DiffusionRequest(f"r{i}", p, list(codes), closed=True, stream=stream))
    out: dict[str, list[torch.Tensor]] = {f"r{i}": [] for i in range(len(reqs))}
    while batcher.num_unfinished():
        for rid, samples, _, error in batcher.update(runner.execute(batcher.schedule())):
            if error:
                raise RuntimeError(f"{rid}: {error}")
            if samples is not None:
                out[rid].append(samples)
    return [torch.cat(out[f"r{i}"]) for i in range(len(reqs))]


def snr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    noise = float((got - ref).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(ref.pow(2).sum()) / noise)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--codes", type=int, default=200)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--first-chunks", default="12,24,36,48")
    args = ap.parse_args()
    device = torch.device("cuda:0" if args.gpu else "cpu")
    spec = TOKEN2WAV_SPECS["token2wav-default-size" if args.gpu else "tiny-token2wav"]
    model = Token2WavModel.from_checkpoint(build_token2wav(spec), device)
    gen = torch.Generator().manual_seed(0)
    reqs = [torch.randint(0, model.num_codes - 1, (args.codes,), generator=gen).tolist() for _ in range(args.requests)]
    base = StreamingConfig()
    t0 = time.perf_counter()
    ref = synthesize(model, base, reqs, stream=False)
    where = torch.cuda.get_device_name(0) if args.gpu else "CPU"
    print(
        f"# {where}; {'default-size' if args.gpu else 'tiny'} token2wav (random weights), exact fp32; "
        f"{args.requests} requests of {args.codes} codes; one shot in {time.perf_counter() - t0:.1f}s; "
        f"other windows: chunk {base.chunk}, left {base.left_context}, right {base.right_context} codes, "
        f"crossfade {base.crossfade_ms:g} ms"
    )
    print("\n| first chunk (codes) | first audio needs (codes) | first-chunk max abs diff | first-chunk SNR (dB) "
          "| whole max abs diff | whole SNR (dB) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    spi = model.samples_per_input
    for fc in (int(x) for x in args.first_chunks.split(",")):
        cfg = msgspec.structs.replace(base, first_chunk=fc)
        got = synthesize(model, cfg, reqs, stream=True)
        head = [(r[: fc * spi], g[: fc * spi]) for r, g in zip(ref, got, strict=True)]
        for r, g in zip(ref, got, strict=True):
            assert r.shape == g.shape, (r.shape, g.shape)
        d_head = max(float((g - r).abs().max()) for r, g in head)
        d_all = max(float((g - r).abs().max()) for r, g in zip(ref, got, strict=True))
        s_head = min(snr_db(r, g) for r, g in head)
        s_all = min(snr_db(r, g) for r, g in zip(ref, got, strict=True))
        print(f"| {fc} | {fc + base.right_context} | {d_head:.2e} | {s_head:.1f} | {d_all:.2e} | {s_all:.1f} |")
    print("\n(max over requests for differences, min over requests for SNR)")


if __name__ == "__main__":
    main()

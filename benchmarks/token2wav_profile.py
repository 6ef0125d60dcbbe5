"""Where token2wav's time goes on a GPU, kernel by kernel (issue 20: at 32 windows one
vocoder call cost as much as three DiT solver steps, far more than its arithmetic needs; at one
window a solver step is bound by kernel latency, not arithmetic).

    python -m benchmarks.token2wav_profile                      # default size, TF32, compiled
    python -m benchmarks.token2wav_profile --dit-dtype bfloat16 # the opt-in bf16 DiT
    python -m benchmarks.token2wav_profile --tiny --cpu         # a CPU smoke run

The vocoder, per batch of b windows of `--frames` mel frames (148: a steady streamed decode span):
- its wall time (best of 5, synchronized), eager and replayed from a CUDA graph, with the
  stage's activations (Triton kernels on CUDA) and, for comparison, the same polyphase
  arithmetic under torch.compile (measured earlier: cuDNN's algorithm search,
  `torch.backends.cudnn.benchmark`, changed nothing: the convolutions are not the cost);
- per upsampling stage (CUDA events): the transposed convolution, the residual blocks;
- the top kernels by GPU time (torch.profiler) at the largest b, and the arithmetic the
  convolutions need (TFLOP).
The DiT, one velocity call (both CFG rows) per batch of b 84-code windows: wall time eager and
replayed from a CUDA graph, and per kernel table the sum of its kernels' GPU time, their count
and the top ones, at the smallest and largest b.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from benchmarks.common.cuda_timing import best_ms, open_device, sync
from benchmarks.common.token2wav_options import T2W_COMPILE
from omni_mp.engines.diffusion.graphs import GraphSet
from omni_mp.engines.diffusion.model import Window
from omni_mp.engines.diffusion.params import DiffusionParams
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel


def conv_tflop(model: Token2WavModel, b: int, frames: int) -> float:
    """The convolutions' multiply-adds x 2 for b windows (what their arithmetic needs)."""
    flop, t = 0.0, frames
    for m in model.vocoder.modules():
        if isinstance(m, torch.nn.ConvTranspose1d):
            flop += 2 * m.in_channels * m.out_channels * m.kernel_size[0] * t  # per input sample
            t = t * m.stride[0]
        elif isinstance(m, torch.nn.Conv1d) and m.groups == 1:
            flop += 2 * m.in_channels * m.out_channels * m.kernel_size[0] * t
    return b * flop / 1e12


def stage_times(model: Token2WavModel, mel: torch.Tensor) -> list[tuple[str, float]]:
    """`Token2WavModel._vocode`'s stages timed with CUDA events (the same calls, in order)."""
    v = model.vocoder
    marks: list[tuple[str, Any]] = []

    def mark(name: str) -> None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        marks.append((name, e))

    with torch.no_grad():
        mark("start")
        db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=model._min_level)) - 20
        h = v.conv_pre(v.normalize_spectrogram(db, 1, -115))
        mark("conv_pre")
        for i in range(v.num_upsample_layers):
            h = v.ups[i][0](h)
            mark(f"up{i} transposed conv ({h.shape[1]} ch x {h.shape[2]})")
            blocks = range(i * v.num_residual_blocks, (i + 1) * v.num_residual_blocks)
            h = sum(model._resblock(k, h) for k in blocks) / v.num_residual_blocks
            mark(f"up{i} residual blocks")
        act = model._act_post(h) if model._acts else v.activation_post(h)
        v.conv_post(act)
        mark("post")
    sync()
    return [(name, marks[i][1].elapsed_time(e)) for i, (name, e) in enumerate(marks[1:])]


def kernel_table(fn: Any, top: int, title: str) -> None:
    """`fn` once under torch.profiler: its kernels' GPU time summed, their count, the top ones."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) / 1000
    count = sum(e.count for e in events)
    print(f"\n## {title}: {count} kernels, {total:.2f} ms of GPU time")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=90))


def dit_profile(model: Token2WavModel, batches: list[int], top: int) -> None:
    """One velocity call per batch of b 84-code windows: eager and CUDA-graph wall time."""
    cuda = model.device.type == "cuda"
    print("\n## DiT velocity (one call, conditional and unconditional rows), b 84-code windows")
    print("| b | rows x frames | eager ms | graph ms |\n|---|---|---|---|")
    calls = {}
    for b in batches:
        params = DiffusionParams(seed=1, speaker="Chelsie")
        g = torch.Generator().manual_seed(b)
        wins = [Window(f"r{i}", torch.randint(0, model.num_codes - 1, (84,), generator=g), 0, params) for i in range(b)]
        conds = [model.condition(w) for w in wins]
        batch = model.collate(conds, torch.tensor([w.params.guidance_scale for w in wins]))
        frames = conds[0].frames
        x = torch.randn(b, frames, model.state_dim, device=model.device)
        t = torch.rand(b, device=model.device)
        with torch.no_grad():
            call = lambda batch=batch, x=x, t=t: model.velocity(batch, x, t)  # noqa: E731
            call()
            eager = best_ms(call)
            graph = GraphSet(8).wrap(call, f"velocity-{b}")
            replay = best_ms(graph) if cuda and graph.ready() else float("nan")
        calls[b] = graph
        print(f"| {b} | {batch.code_embed.shape[0]} x {frames} | {eager:.2f} | {replay:.2f} |", flush=True)
    for b in (min(batches), max(batches)) if cuda else ():
        kernel_table(calls[b], top, f"DiT velocity at b={b}, replayed from its graph")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matmul", choices=["highest", "high"], default="high")
    ap.add_argument("--compile", choices=list(T2W_COMPILE), default="all")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--frames", type=int, default=148)
    ap.add_argument("--top", type=int, default=25, help="kernels listed from the profile")
    ap.add_argument("--dit-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--skip-vocoder", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    cuda = not args.cpu
    device = open_device(args.cpu, args.matmul)
    if device is None:
        return 2
    spec = TOKEN2WAV_SPECS["tiny-token2wav" if args.tiny else "token2wav-default-size"]
    options = {**T2W_COMPILE[args.compile], "dit_dtype": args.dit_dtype}
    model = Token2WavModel.from_checkpoint(build_token2wav(spec), device, **options)
    c = model.vocoder.config
    print(
        f"# {torch.cuda.get_device_name(0) if cuda else 'CPU'}; BigVGAN upsample rates {c.upsample_rates}, "
        f"initial channels {c.upsample_initial_channel}, resblock kernels {c.resblock_kernel_sizes}; "
        f"float32_matmul {args.matmul}, compile {args.compile}, DiT {args.dit_dtype}; "
        f"{args.frames} mel frames per window"
    )
    batches = [int(x) for x in args.batches.split(",")]
    dit_profile(model, batches, args.top)
    if args.skip_vocoder:
        return 0
    gen = torch.Generator(device).manual_seed(0)
    mels = {b: torch.randn(b, model.state_dim, args.frames, device=device, generator=gen) - 4.0 for b in batches}
    kinds = activation_kinds(model)
    print(f"\n## vocoder, b windows of {args.frames} frames: ms, best of 5 (activations: {', '.join(kinds)})")
    print("| b | conv TFLOP | activations | eager | graph | vs the first: max abs |\n|---|---|---|---|---|---|")
    for b in batches:
        mel, ref = mels[b], None
        for kind, (acts, post) in kinds.items():
            model._acts, model._act_post = acts, post
            with torch.no_grad():
                out = model._vocode(mel)  # compiles
                eager = best_ms(lambda: model._vocode(mel))  # noqa: B023 (called at once)
                graph = float("nan")
                if cuda:
                    g = GraphSet(8).wrap(model._vocode, f"vocoder-{b}-{kind}")
                    if g.ready(mel):
                        graph = best_ms(lambda: g(mel))  # noqa: B023
            diff = "-" if ref is None else f"{float((out - ref).abs().max()):.2e}"
            ref = out if ref is None else ref
            print(f"| {b} | {conv_tflop(model, b, args.frames):.2f} | {kind} | {eager:.1f} | {graph:.1f} | {diff} |",
                  flush=True)  # fmt: skip
    if not cuda:
        return 0
    big = mels[max(batches)]
    for kind, (acts, post) in kinds.items():
        model._acts, model._act_post = acts, post
        print(f"\n## stages at b={max(batches)}, activations {kind} (ms, CUDA events)")
        for name, ms in stage_times(model, big):
            print(f"- {name}: {ms:.2f}")
        kernel_table(lambda: model._vocode(big), args.top, f"vocoder at b={max(batches)}, activations {kind}")
    return 0


def activation_kinds(model: Token2WavModel) -> dict[str, tuple[Any, Any]]:
    """The model's own activations (Triton kernels on CUDA) and the polyphase functions under
    torch.compile (what a CUDA stage ran before the kernels; a CPU stage's)."""
    from functools import partial

    from omni_mp.models.qwen2_5_omni.token2wav_fused import AntialiasedSnake, down_sample, up_snake

    kinds = {"the stage's": (model._acts, model._act_post)}
    if model.device.type == "cuda" and model._acts:
        fns = (torch.compile(up_snake, dynamic=True), torch.compile(down_sample, dynamic=True))
        v = model.vocoder
        acts = [[partial(AntialiasedSnake(a), fns=fns) for a in block.activations] for block in v.resblocks]
        kinds["torch.compile"] = (acts, partial(AntialiasedSnake(v.activation_post), fns=fns))
    return kinds


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

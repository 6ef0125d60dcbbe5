"""Where a Qwen-Image denoising step's time goes, in one process on one GPU (issue 21): the
real-size DiT (random weights, bf16, built in memory) stepped three ways on the same inputs,
one image with true CFG (a prompt of --text-len rows and a negative prompt of --neg-len):

- diffusers: the two transformer calls and the CFG combination as `QwenImagePipeline` makes
  them (no mask: its pipeline drops an all-ones mask);
- model: omni_mp's `QwenImageModel.velocity` on the collated batch (the calls its cost model
  plans) plus the Euler update;
- runner: omni_mp's `DiffusionRunner.execute` (what the DiT stage's worker runs per step).

Each is timed per step (CUDA events around --steps steps, after 2 warm-up steps), then run
once under torch.profiler: its CUDA kernels by total time (top --top). The same again after
`import vllm` (the stage process has it imported: vLLM's CUDA platform module sets backend
flags at import) to see whether anything of vLLM's changes the kernels.

    python3 -m benchmarks.qwen_image_step_profile [--sizes 1024,512] [--out DIR]
    python3 -m benchmarks.qwen_image_step_profile --ab 5 --sizes 512      # cuDNN attention on/off, alternated
    python3 -m benchmarks.qwen_image_step_profile --parts-ab 5            # a step in parts of 10 blocks / whole
    python3 -m benchmarks.qwen_image_step_profile --shrink --sizes 64     # a CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from benchmarks.common.cuda_timing import kernels, timed
from benchmarks.common.qwen_image_dir import DIT_CONFIG, SHRINK, VAE_CONFIG, build_on_device
from benchmarks.common.report import make_say
from omni_mp.engines.diffusion.batcher import StepPlan, TrajectorySpec
from omni_mp.engines.diffusion.chunking import one_shot
from omni_mp.engines.diffusion.model import Window
from omni_mp.engines.diffusion.runner import DiffusionRunner
from omni_mp.models.qwen_image.dit import ImageInputs, QwenImageModel, QwenImageOptions
from omni_mp.models.qwen_image.params import ImageParams
from omni_mp.models.qwen_image.schedule import FlowSchedule

CFG_SCALE = 4.0


say = make_say("step_profile")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1024,512")
    ap.add_argument("--text-len", type=int, default=75, help="prompt rows (benchmarks.image_gpu's prompt: 75)")
    ap.add_argument("--neg-len", type=int, default=6, help="negative prompt rows (' ': 6)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shrink", action="store_true", help="toy widths, fp32 (a check of this script)")
    ap.add_argument("--ab", type=int, default=0, help="only the runner step, cuDNN attention on/off, N alternations")
    ap.add_argument(
        "--parts-ab",
        type=int,
        default=0,
        help="only the runner step, in parts of 10 blocks (one execute() each) / whole, N alternations",
    )
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.shrink else torch.bfloat16
    dit_cfg = {**DIT_CONFIG, **SHRINK["dit"]} if args.shrink else DIT_CONFIG
    vae_cfg = {**VAE_CONFIG, **SHRINK["vae"]} if args.shrink else VAE_CONFIG
    t0 = time.perf_counter()
    transformer = build_on_device(_dit_class(), dit_cfg, device, dtype)
    vae = build_on_device(_vae_class(), vae_cfg, device, dtype)
    billions = sum(p.numel() for p in transformer.parameters()) / 1e9
    say(f"built the DiT ({billions:.1f}B) in {time.perf_counter() - t0:.0f}s")
    model = QwenImageModel(transformer, vae, FlowSchedule(), QwenImageOptions())
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randn(args.text_len, model.text_width, generator=gen)
    negative = torch.randn(args.neg_len, model.text_width, generator=gen)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    results: dict[str, Any] = {"device": name, "sizes": {}}
    phases = ("cudnn a/b",) if args.ab else ("parts a/b",) if args.parts_ab else ("torch only", "after import vllm")
    for phase in phases:
        if phase == "after import vllm":
            if device != "cuda":
                break
            import vllm.platforms.cuda  # noqa: F401  (what the stage process has imported)

            say(f"sdp flags: flash {torch.backends.cuda.flash_sdp_enabled()}, "
                f"cudnn {torch.backends.cuda.cudnn_sdp_enabled()}, "
                f"mem-efficient {torch.backends.cuda.mem_efficient_sdp_enabled()}")  # fmt: skip
        for side in (int(x) for x in args.sizes.split(",")):
            key = f"{side}x{side} {phase}"
            results["sizes"][key] = one_size(model, prompt, negative, side, args)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "qwen_image_step_profile.json").write_text(json.dumps(results, indent=1))
    return 0


def one_size(
    model: QwenImageModel, prompt: torch.Tensor, negative: torch.Tensor, side: int, args: Any
) -> dict[str, Any]:
    dtype = model.dtype
    p = ImageParams(height=side, width=side, num_inference_steps=50, seed=1, negative_prompt=" ",
                    true_cfg_scale=CFG_SCALE)  # fmt: skip
    window = Window("r", torch.zeros(0, dtype=torch.long), 0, p, ImageInputs(prompt, negative))
    start = model.start(window)
    cond = model.condition(window)
    x = start.x[None].clone()
    t = start.grid[:1].float()
    shape = cond.shape
    say(f"{side}x{side}: {x.shape[1]} image tokens, text {prompt.shape[0]} / {negative.shape[0]} rows")

    # diffusers' step: two calls, no mask, the CFG combination of QwenImagePipeline
    timestep = model.schedule.model_time(t).to(dtype)

    def call(lat: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        kw = {"encoder_hidden_states_mask": None, "img_shapes": [[shape]], "return_dict": False}
        return model.transformer(hidden_states=lat, timestep=timestep, encoder_hidden_states=text[None], **kw)[0]

    def diffusers_step() -> None:
        lat = x.to(dtype)
        c, n = call(lat, cond.prompt), call(lat, cond.negative)  # type: ignore[arg-type]
        comb = n + CFG_SCALE * (c - n)
        out = comb * (torch.norm(c, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))
        x.add_(out.float(), alpha=0.0)  # the update's kernel, kept a no-op so every step sees the same x

    batch = model.collate([cond], torch.tensor([CFG_SCALE]))
    say(f"  model plan: {len(batch.calls)} call(s), rows per call {[c.text.shape[0] for c in batch.calls]}, "
        f"masked {[c.mask is not None for c in batch.calls]}")  # fmt: skip

    def model_step() -> None:
        x.add_(model.velocity(batch, x, t), alpha=0.0)

    runner = DiffusionRunner(model, crossfade=0)
    runner.execute(StepPlan([TrajectorySpec(0, window, one_shot(0))], [0], [], 1))

    def runner_step() -> None:
        tr = runner.trajectories[0]
        tr.k = 1  # stay mid-trajectory: every timed step is a middle step
        runner.execute(StepPlan([], [0], [], 1))

    if args.ab:
        return cudnn_ab(runner_step, args)
    if args.parts_ab:
        return parts_ab(model, runner, args)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for name, fn in (("diffusers", diffusers_step), ("model", model_step), ("runner", runner_step)):
            ms = timed(fn, args.steps)
            say(f"  {name}: {ms:.1f} ms per step")
            out[name] = {"ms_per_step": ms, "kernels": kernels(fn, args.top, say)}
    say(f"  model / diffusers {out['model']['ms_per_step'] / out['diffusers']['ms_per_step']:.3f}, "
        f"runner / diffusers {out['runner']['ms_per_step'] / out['diffusers']['ms_per_step']:.3f}")  # fmt: skip
    return out


def cudnn_ab(runner_step: Any, args: Any) -> dict[str, Any]:
    """The runner's step with SDPA's cuDNN kernel allowed and not, alternated --ab times
    (launch-bound sizes vary run to run: alternating keeps host noise out of the ratio)."""
    times: dict[str, list[float]] = {"cudnn on": [], "cudnn off": []}
    with torch.no_grad():
        for _ in range(args.ab):
            for name, flag in (("cudnn on", True), ("cudnn off", False)):
                torch.backends.cuda.enable_cudnn_sdp(flag)
                times[name].append(timed(runner_step, args.steps))
    torch.backends.cuda.enable_cudnn_sdp(True)
    med = {k: statistics.median(v) for k, v in times.items()}
    say(f"  runner step, median of {args.ab}: cuDNN on {med['cudnn on']:.1f} ms, off {med['cudnn off']:.1f} ms "
        f"(on / off {med['cudnn on'] / med['cudnn off']:.3f}); all: {times}")  # fmt: skip
    return {"ab_ms": times, "median_ms": med}


def parts_ab(model: QwenImageModel, runner: DiffusionRunner, args: Any) -> dict[str, Any]:
    """The runner's step whole (`blocks_per_part` 0) and in parts of 10 blocks, one
    `execute()` per part as the engine runs them, alternated --parts-ab times."""
    times: dict[str, list[float]] = {"parts of 10": [], "whole": []}

    def parted_step() -> None:
        runner.trajectories[0].k = 1  # stay mid-trajectory
        while not runner.execute(StepPlan([], [0], [], 1)).ended:
            pass

    with torch.no_grad():
        for _ in range(args.parts_ab):
            for name, bpp in (("parts of 10", 10), ("whole", 0)):
                model.options = msgspec.structs.replace(model.options, blocks_per_part=bpp)
                times[name].append(timed(parted_step, args.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    say(f"  runner step, median of {args.parts_ab}: in parts {med['parts of 10']:.1f} ms, whole {med['whole']:.1f} ms "
        f"(parts / whole {med['parts of 10'] / med['whole']:.3f}); all: {times}")  # fmt: skip
    return {"ab_ms": times, "median_ms": med}


def _dit_class() -> Any:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel


def _vae_class() -> Any:
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage


if __name__ == "__main__":
    sys.exit(main())

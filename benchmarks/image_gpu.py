"""Qwen-Image at its real sizes with random weights on one GPU: omni_mp's two stages (the text
encoder on vLLM -> the DiT + VAE on our diffusion engine) against diffusers' QwenImagePipeline
on the same GPU, in one run (issue 21, deliverable 6).

Sizes, written in benchmarks.common.qwen_image_dir and never taken from library defaults (the
issue's; the text encoder is Qwen2.5-VL-7B's language model): text encoder hidden 3584, 28 layers, 28 heads, 4 KV heads,
intermediate 18944, vocab 152064 (vision tower: Qwen2.5-VL-7B's, built by diffusers' side
only: vLLM's text-only stage skips it); DiT 60 MMDiT blocks, 24 heads x 128, joint attention
3584, RoPE axes (16, 56, 56), 64 -> 16 channels; VAE base 96, z 16, dim_mult (1, 2, 4, 4), 2 res
blocks, temporal downsample (F, T, T). bf16 throughout. The checkpoint dir is written once per
host (`--work-dir`, ~42 GB: the DiT's and the VAE's random tensors; vLLM's text encoder uses
`load_format: dummy`, diffusers' is built randomly in memory). Both sides load the same DiT and
VAE tensors. The tokenizer is the tiny checkpoint's (trained locally: nothing is fetched);
every request's prompt is the same length on both sides. True CFG is on by default (negative
prompt " ", true_cfg_scale 4: two transformer passes per step, as the published anchors ran).

Phases, each in a fresh subprocess (GPU memory returned between them), each writing
`<out>/<phase>.json`; the report is made from every phase file in `--out`, so phases (and
sizes, concurrency levels) can be split across invocations:
  build      write the checkpoint dir (skipped when it is there)
  omni       omni_mp: start (time to ready), then per size and concurrency c: a warm-up of
             `--warmup` x c unmeasured requests with c in flight (the DiT's batches of that
             level: benchmarks.common.warmup), then c requests in flight, `--rounds` x c
             requests in all (images/s, latency mean / p50 / max); Poisson arrivals at `--poisson` fractions of the
             capacity just measured (the best images/s of that size): mean / p99 latency, and
             the wait from arrival to the request's first denoising step (the first DiT step
             starting after the request entered the DiT engine, from the stage's step
             timeline); the DiT's step time with one request in flight.
  diffusers  QwenImagePipeline: per size and level, `--warmup` unmeasured calls of c prompts,
             then c=1 one request at a time; c > 1 one call with c prompts (diffusers' own
             batching); the transformer's time per denoising step
             (its calls of one step, CUDA-synchronized, with one request).
Outputs in --out: image_gpu.json, image_gpu.md (the table, ratios and targets), image_gpu.png
(matplotlib) or image_gpu.svg (written by hand when matplotlib is missing).

On the lent GPU machines (no network; the image has python 3.12, torch 2.11.0 cu130,
transformers, matplotlib; no diffusers and no vLLM): carry the wheels of the GPU host recipe
(scripts/gpu/) plus diffusers==0.42.1 (pure python; its requirements importlib_metadata,
filelock, huggingface-hub, numpy, regex, requests, safetensors, Pillow are in the image:
the preflight lists anything missing), then, one device call each (ENV: the export line
`export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
HF_HUB_OFFLINE=1`, written out), e.g.
  ENV && python3 -m benchmarks.image_gpu --phases build,omni --sizes 512:20 --out /tmp/image_gpu --deadline-s 560
  ENV && python3 -m benchmarks.image_gpu --phases diffusers --sizes 512:20 --out /tmp/image_gpu
(docs/benchmarks/qwen_image.md: the whole split over device calls and the time of each).
Locally, to re-render from fetched phase files: python -m benchmarks.image_gpu --phases '' --out DIR
CPU checks of every phase (~3-4 min each on 2 cores): the tiny checkpoint (fp32, 64x64, 3 steps),
and the real-size path (build, dummy-loaded encoder, diffusers' side built in memory) at toy widths:
  .venv/bin/python -m benchmarks.image_gpu --tiny --out /tmp/image_gpu_tiny
  .venv/bin/python -m benchmarks.image_gpu --shrink --out /tmp/image_gpu_shrink
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import phases
from benchmarks.common.qwen_image_dir import (
    build_on_device,
    build_qwen_image_dir,
    real_dtype,
    tiny_dir,
)
from benchmarks.common.report import fmt, make_say, pyplot
from benchmarks.common.stats import percentile_nearest_rank as percentile
from benchmarks.common.timelines import stage_timeline
from benchmarks.common.warmup import Warmups, warmup_line
from omni_mp.stage_configs import CONFIG_DIR

PHASES = ["build", "omni", "diffusers"]
T_START = time.perf_counter()
RENDER_MARGIN_S = 10
NEGATIVE_PROMPT = " "
CFG_SCALE = 4.0
# A prompt of a fixed length, the same for every request on both sides (distinct seeds).
PROMPT = (
    "A red cube on a blue table beside a sleeping cat, morning light through a window, "
    "a bookshelf behind, a green plant in a clay pot"
)


say = make_say("image_gpu")
WARMUP_OMNI = "before each level c is measured, --warmup x c unmeasured requests with c in flight"
WARMUP_DIFFUSERS = "before each level c is measured, --warmup unmeasured calls of c prompts"


def parse_sizes(spec: str) -> list[tuple[int, int]]:
    """'512:20,1024:50' -> [(512, 20), (1024, 50)]: square side in pixels, denoising steps."""
    out = []
    for part in filter(None, spec.split(",")):
        side, _, steps = part.partition(":")
        out.append((int(side), int(steps)))
    return out


def size_key(side: int, steps: int) -> str:
    return f"{side}x{side}/{steps}"


def mode(args: argparse.Namespace) -> str:
    if args.tiny:
        return "the tiny checkpoint (fp32, CPU: a check, not a measurement)"
    if args.shrink:
        return "the real path at toy widths (fp32, CPU: a check, not a measurement)"
    return "real sizes, random weights, bf16"


# ---- the checkpoint -----------------------------------------------------------------------------
def checkpoint_dir(args: argparse.Namespace) -> Path:
    return tiny_dir() if args.tiny else args.work_dir / ("qwen_image_shrunk" if args.shrink else "qwen_image_real")


# ---- omni_mp --------------------------------------------------------------------------------------
def omni_config(args: argparse.Namespace, ckpt: Path) -> dict[str, Any]:
    """The family's pipeline on `ckpt` (omni_mp/stage_configs/qwen_image.yaml on the GPU, the tiny one on
    the CPU): the text encoder with random weights (`load_format: dummy`), batches as large as
    the concurrency."""
    import yaml

    template = "tiny_qwen_image.yaml" if args.tiny or args.shrink else "qwen_image.yaml"
    cfg = yaml.safe_load((CONFIG_DIR / template).read_text())
    conc = max([*args.concurrency, 16])  # (Poisson loads may hold more in flight than the sweep)
    cfg["name"] = "qwen_image_bench"
    cfg.setdefault("timeouts", {})["stage_startup_s"] = 900
    for stage in cfg["stages"]:
        stage["model"] = str(ckpt)
        stage.pop("restart", None)
        ea = stage.setdefault("engine_args", {})
        if stage.get("kind", "ar") == "diffusion":
            d = stage.setdefault("diffusion", {})
            d["max_batch"] = max(d.get("max_batch", 1), conc)
            if not args.tiny:
                d["model_options"] = {**d.get("model_options", {}), "dtype": "float32" if args.shrink else "bfloat16",
                                      "max_height": 2048, "max_width": 2048}  # fmt: skip
            if args.blocks_per_part is not None:
                d.setdefault("model_options", {})["blocks_per_part"] = args.blocks_per_part
            if args.restart_step_before is not None:
                d["restart_step_before"] = args.restart_step_before
        else:
            ea["max_num_seqs"] = max(2 * conc, ea.get("max_num_seqs", 1))  # (a prompt and its negative)
            ea["enable_prefix_caching"] = False
            if not args.tiny:
                ea.update({"load_format": "dummy", "max_model_len": 2048})
            if not (args.tiny or args.shrink):
                ea["dtype"] = "bfloat16"
                ea.pop("enforce_eager", None)
                # Both stages share GPU 0: the encoder's KV cache is fixed (no profiling run
                # beside the DiT loading), and vLLM's start check wants this share free.
                ea.update({"kv_cache_memory_bytes": 4 << 30, "gpu_memory_utilization": args.encoder_share})
        stage["devices"] = [] if args.tiny or args.shrink else [0]
    return cfg


def image_stage_id(cfg: Any) -> int:
    return next(s.id for s in cfg.final_stages if s.kind == "diffusion")  # the DiT


def request_params(side: int, steps: int, seed: int, cfg: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"height": side, "width": side, "num_inference_steps": steps, "seed": seed}
    if cfg:
        params.update({"negative_prompt": NEGATIVE_PROMPT, "true_cfg_scale": CFG_SCALE})
    return params


async def _one(client: Any, params: dict[str, Any], dit: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    done = await client.generate(PROMPT, params=params, timeout_s=3600)
    latency = time.perf_counter() - t0
    image = next(o.image for o in done.outputs if o.image is not None)
    timing = next(d for d in done.stage_timings if d.stage_id == dit)
    assert tuple(image.shape) == (params["height"], params["width"], 3), image.shape
    return {"latency_s": latency, "t_submit": done.t_submit, "t_dit_started": timing.t_started,
            "t_finished": done.t_finished}  # fmt: skip


async def _closed_loop(
    endpoint: str, n: int, c: int, side: int, steps: int, dit: int, args: Any, seed0: int | None = None
) -> dict[str, Any]:
    """n requests, c in flight at a time, seeds from `seed0` (default: the level's own)."""
    from omni_mp.client.omni_client import AsyncOmniClient

    first = 1_000_000 * c + side if seed0 is None else seed0
    seeds = iter(range(first, first + n))
    reqs: list[dict[str, Any]] = []

    async def worker(client: Any) -> None:
        for seed in seeds:
            reqs.append(await _one(client, request_params(side, steps, seed, args.cfg), dit))

    async with AsyncOmniClient(endpoint) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(c)))
        wall = time.perf_counter() - t0
    lat = [r["latency_s"] for r in reqs]
    return {
        "requests": n,
        "wall_s": wall,
        "images_per_s": n / wall,
        "latency_mean_s": statistics.fmean(lat),
        "latency_p50_s": statistics.median(lat),
        "latency_max_s": max(lat),
        "windows": [(r["t_dit_started"], r["t_finished"]) for r in reqs],
    }


async def _poisson(endpoint: str, n: int, rate: float, side: int, steps: int, dit: int, args: Any) -> list[dict]:
    """n requests arriving as a Poisson process of `rate` per second (seeded)."""
    from omni_mp.client.omni_client import AsyncOmniClient

    rng = random.Random(int(rate * 1000) + side)
    gaps = [rng.expovariate(rate) for _ in range(n)]
    async with AsyncOmniClient(endpoint) as client:
        tasks = []
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            params = request_params(side, steps, 7_000_000 + i, args.cfg)
            tasks.append(asyncio.ensure_future(_one(client, params, dit)))
        return list(await asyncio.gather(*tasks))


def model_steps(steps: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[float]]:
    """The DiT's denoising steps from its engine-step records: a step run in parts spans the
    records from the one that began it to the one that ended it. Returns the steps ("t": when
    it began, "step_ms": its records' time) and the times of the steps begun again before
    they ended (restarted with new requests: the parts run so far were discarded). Records
    without the fields (older profiles) are one step each."""
    out: list[dict[str, Any]] = []
    discarded: list[float] = []
    cur: dict[str, Any] | None = None
    for rec in steps:
        begun, ended = rec.get("steps_begun", 1), rec.get("steps_ended", 1)
        if begun:
            if cur is not None:
                discarded.append(cur["step_ms"])
            cur = {"t": rec["t"], "step_ms": 0.0}
        if cur is not None:
            cur["step_ms"] += rec["step_ms"]
        if ended and cur is not None:
            out.append(cur)
            cur = None
    return out, discarded


def step_starts(steps: list[dict[str, Any]]) -> list[float]:
    """When each denoising step began, restarted ones included (each takes in every request
    admitted before it)."""
    return sorted(rec["t"] for rec in steps if rec.get("steps_begun", 1))


def first_step_waits(reqs: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[float]:
    """Per request: arrival (its submission) -> the start of the DiT's first denoising step
    that began after the request entered the DiT engine (a request joins the batch when a
    step begins: between steps, or in one restarted for it between its parts)."""
    starts = step_starts(steps)
    out = []
    for r in reqs:
        first = next((t for t in starts if t >= r["t_dit_started"]), None)
        out.append(float("nan") if first is None else first - r["t_submit"])
    return out


def single_request_step_ms(windows: list[tuple[float, float]], steps: list[dict[str, Any]]) -> float | None:
    """The DiT's median step time over steps inside the windows of requests run one at a time."""
    inside = [s["step_ms"] for s in steps if any(a <= s["t"] <= b for a, b in windows)]
    return statistics.median(inside) if inside else None


def run_omni(args: argparse.Namespace) -> dict[str, Any]:
    """omni_mp's side: per size, each level warmed up and then measured, then the Poisson loads;
    the DiT's steps from its stage timeline."""
    from omni_mp.config.validate import parse_config
    from omni_mp.control.embedded import embedded_pipeline
    from omni_mp.stage.timeline import PROFILE_DIR_ENV

    ckpt = checkpoint_dir(args)
    cfg = parse_config(omni_config(args, ckpt))
    dit = image_stage_id(cfg)
    profile_dir = Path(tempfile.mkdtemp(prefix="image_gpu-profile-"))
    os.environ[PROFILE_DIR_ENV] = str(profile_dir)  # inherited by the stage processes
    out: dict[str, Any] = {"cfg": args.cfg, "mode": mode(args), "sizes": {}, "warmup_how": WARMUP_OMNI}
    pending: dict[str, Any] = {}
    t0 = time.perf_counter()
    with embedded_pipeline(cfg, progress=say) as coord:
        out["cold_start_s"] = time.perf_counter() - t0
        say(f"omni: pipeline ready in {out['cold_start_s']:.1f}s")
        for side, steps in args.sizes:
            pending[size_key(side, steps)] = omni_size(coord.client_endpoint, side, steps, dit, args)
    out["device"] = phases.device_name()  # (after the stages: no CUDA context of this process beside them)
    records = stage_timeline(profile_dir, dit)  # the stage processes have exited: timelines written
    if isinstance(records, str):
        raise RuntimeError(records)
    for key, res in pending.items():
        out["sizes"][key] = dit_steps(res, records)
    shutil.copytree(profile_dir, args.out / "profile-omni", dirs_exist_ok=True)
    shutil.rmtree(profile_dir, ignore_errors=True)  # copied to --out
    return out


def omni_size(ep: str, side: int, steps: int, dit: int, args: argparse.Namespace) -> dict[str, Any]:
    """One size: per level c, --warmup x c unmeasured requests (c in flight: the DiT's batches of
    that level), then the level's measured requests; then Poisson loads at fractions of the best
    images/s measured (which the levels have warmed up)."""
    key = size_key(side, steps)
    res: dict[str, Any] = {"levels": {}}
    warmups = Warmups(WARMUP_OMNI)
    for c in args.concurrency:
        if args.warmup:
            t0 = time.time()
            w = asyncio.run(_closed_loop(ep, args.warmup * c, c, side, steps, dit, args, seed0=3_000_000 * c + side))
            warmups.warmed(c, t0, args.warmup * c)
            say(f"omni {key} c={c}: warm-up of {args.warmup * c} requests {w['wall_s']:.2f}s (not measured)")
        n = c * args.rounds if c > 1 else max(2, args.rounds)
        t0 = time.time()
        level = asyncio.run(_closed_loop(ep, n, c, side, steps, dit, args))
        warmups.measured(c, t0)
        level["warmup"] = warmups.levels[str(c)]
        res["levels"][str(c)] = level
        say(f"omni {key} c={c}: {level['images_per_s']:.3f} images/s, latency mean "
            f"{level['latency_mean_s']:.2f}s p50 {level['latency_p50_s']:.2f}s ({n} requests)")  # fmt: skip
    measured = [lv["images_per_s"] for lv in res["levels"].values()]
    capacity = args.capacity.get(key, max(measured, default=None))
    res["capacity_images_per_s"] = capacity
    res["poisson"] = {}
    for frac in args.poisson if capacity else []:
        t_from = time.time()
        reqs = asyncio.run(_poisson(ep, args.poisson_requests, frac * capacity, side, steps, dit, args))
        res["poisson"][str(frac)] = {"rate": frac * capacity, "requests": reqs, "window": (t_from, time.time())}
        lat = [r["latency_s"] for r in reqs]
        say(f"omni {key} Poisson {frac:.0%} of {capacity:.3f}/s: latency mean {statistics.fmean(lat):.2f}s "
            f"p99 {percentile(lat, 0.99):.2f}s")  # fmt: skip
    return res


def dit_steps(res: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """A size's results with what the DiT's step records say: its step at one request, and per
    Poisson load its step under that load, the steps restarted and each request's wait from
    arrival to its first step."""
    steps_rec, _ = model_steps(records)
    one = res["levels"].get("1")
    res["dit_step_ms_one_request"] = single_request_step_ms(one["windows"], steps_rec) if one else None
    for p in res["poisson"].values():
        waits = first_step_waits(p["requests"], records)
        lat = [r["latency_s"] for r in p["requests"]]
        a, b = p.pop("window")
        loaded = [st["step_ms"] for st in steps_rec if a <= st["t"] <= b]
        _, dropped = model_steps([r for r in records if a <= r["t"] <= b])
        p.update({
            "dit_step_ms_p50": statistics.median(loaded) if loaded else None,
            "steps_restarted": len(dropped),
            "restarted_parts_ms": sum(dropped),
            "latency_mean_s": statistics.fmean(lat),
            "latency_p99_s": percentile(lat, 0.99),
            "first_step_wait_mean_s": statistics.fmean(waits),
            "first_step_wait_p99_s": percentile(waits, 0.99),
            "first_step_wait_max_s": max(waits),
        })  # fmt: skip
        del p["requests"]
    for level in res["levels"].values():
        del level["windows"]
    return res


# ---- diffusers ------------------------------------------------------------------------------------
def diffusers_pipeline(args: argparse.Namespace) -> Any:
    import torch
    from diffusers import QwenImagePipeline

    ckpt = checkpoint_dir(args)
    device = "cpu" if args.tiny or args.shrink else "cuda"
    if args.tiny:
        return QwenImagePipeline.from_pretrained(ckpt, dtype=torch.float32).to(device)
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    dtype = real_dtype(args.shrink)
    config = Qwen2_5_VLConfig(**json.loads((ckpt / "text_encoder" / "config.json").read_text()))
    text = build_on_device(Qwen2_5_VLForConditionalGeneration, {"config": config}, device, dtype)
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(ckpt / "scheduler"),
        vae=AutoencoderKLQwenImage.from_pretrained(ckpt / "vae", dtype=dtype).to(device),
        text_encoder=text,
        tokenizer=AutoTokenizer.from_pretrained(ckpt / "tokenizer"),
        transformer=QwenImageTransformer2DModel.from_pretrained(ckpt / "transformer", dtype=dtype).to(device),
    )


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _diffusers_call(pipe: Any, n: int, side: int, steps: int, seed: int, cfg: bool) -> float:
    import torch

    kwargs: dict[str, Any] = {"negative_prompt": [NEGATIVE_PROMPT] * n, "true_cfg_scale": CFG_SCALE} if cfg else {}
    gen = [torch.Generator("cpu").manual_seed(seed + i) for i in range(n)]
    _sync()
    t0 = time.perf_counter()
    images = pipe(prompt=[PROMPT] * n, height=side, width=side, num_inference_steps=steps, generator=gen,
                  output_type="np", **kwargs).images  # fmt: skip
    _sync()
    assert images.shape[:3] == (n, side, side), images.shape
    return time.perf_counter() - t0


def transformer_step_ms(pipe: Any, side: int, steps: int, cfg: bool) -> float:
    """The transformer's time per denoising step (its 1 or 2 calls, synchronized) for one image."""
    calls: list[float] = []
    started: list[float] = []

    def pre(module: Any, args: Any, kwargs: Any) -> None:
        _sync()
        started.append(time.perf_counter())

    def post(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        _sync()
        calls.append(time.perf_counter() - started.pop())

    h1 = pipe.transformer.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = pipe.transformer.register_forward_hook(post, with_kwargs=True)
    try:
        _diffusers_call(pipe, 1, side, steps, 99, cfg)
    finally:
        h1.remove()
        h2.remove()
    per_step = len(calls) // steps
    return 1000 * sum(calls[per_step:]) / (steps - 1)  # the first step's calls left out (warm-up)


def run_diffusers(args: argparse.Namespace) -> dict[str, Any]:
    """diffusers' side: per size, each level warmed up and then measured (c = 1: one request at
    a time; c > 1: one call of c prompts), then the transformer's time per step."""
    t0 = time.perf_counter()
    pipe = diffusers_pipeline(args)
    pipe.set_progress_bar_config(disable=True)
    out: dict[str, Any] = {"device": phases.device_name(), "cfg": args.cfg, "mode": mode(args), "sizes": {},
                           "build_s": time.perf_counter() - t0, "warmup_how": WARMUP_DIFFUSERS}  # fmt: skip
    for side, steps in args.sizes:
        key = size_key(side, steps)
        res: dict[str, Any] = {"levels": {}}
        for c in args.concurrency:
            res["levels"][str(c)] = lv = diffusers_level(pipe, side, steps, c, args)
            say(f"diffusers {key} c={c}: {lv['images_per_s']:.3f} images/s, latency mean {lv['latency_mean_s']:.2f}s")
        if args.step_timing:
            res["transformer_step_ms"] = transformer_step_ms(pipe, side, steps, args.cfg)
            say(f"diffusers {key}: transformer {res['transformer_step_ms']:.1f} ms per step")
        out["sizes"][key] = res
    return out


def diffusers_level(pipe: Any, side: int, steps: int, c: int, args: argparse.Namespace) -> dict[str, Any]:
    """One level of diffusers: --warmup unmeasured calls of c prompts, then the measured ones."""
    warmups = Warmups(WARMUP_DIFFUSERS)
    if args.warmup:
        t0 = time.time()
        for i in range(args.warmup):
            _diffusers_call(pipe, c, side, steps, 5000 + 100 * i, args.cfg)
        warmups.warmed(c, t0, args.warmup * c)
    t0 = time.time()
    if c == 1:
        lat = [_diffusers_call(pipe, 1, side, steps, 10 + i, args.cfg) for i in range(max(2, args.rounds))]
        wall = sum(lat)
    else:
        lat = []
        for r in range(args.rounds):
            lat += [_diffusers_call(pipe, c, side, steps, 100 * r, args.cfg)] * c  # each waits for the batch
        wall = sum(lat) / c
    warmups.measured(c, t0)
    return {
        "requests": len(lat), "wall_s": wall, "images_per_s": len(lat) / wall,
        "latency_mean_s": statistics.fmean(lat), "latency_p50_s": statistics.median(lat),
        "latency_max_s": max(lat), "mode": "one at a time" if c == 1 else f"one call of {c} prompts",
        "warmup": warmups.levels[str(c)],
    }  # fmt: skip


# ---- report -------------------------------------------------------------------------------------
ANCHORS = (
    "Published anchors (other hardware and settings, not run here): vllm-omni 2.21 s for 512x512 at 20 steps "
    "on 4 A100s (CFG- and sequence-parallel, true CFG); SGLang 0.167 s/step at 512x512 and 0.243 s/step at "
    "1024x1024 on one H200 (torch.compile)."
)


def _best(levels: dict[str, Any]) -> float | None:
    return max((lv["images_per_s"] for lv in levels.values()), default=None)


def targets(omni: dict[str, Any], hf: dict[str, Any]) -> list[str]:
    """One line per target of the issue: the value measured and whether it is met."""

    def verdict(ok: bool | None) -> str:
        return "not measured" if ok is None else "met" if ok else "NOT met"

    out = []
    for side, need in ((512, 2.5), (1024, 0.97)):
        key = next((k for k in set(omni) & set(hf) if k.startswith(f"{side}x{side}/")), None)
        o = _best(omni[key]["levels"]) if key else None
        h = hf[key]["levels"].get("1", {}).get("images_per_s") if key else None
        r = o / h if o and h else None
        out.append(f"- {side}x{side}: best omni_mp images/s / diffusers one at a time = {fmt(r, '{:.2f}x')} "
                   f"(target >= {need}x): {verdict(None if r is None else r >= need)}")  # fmt: skip
        if side == 1024:
            a = omni[key].get("dit_step_ms_one_request") if key else None
            b = hf[key].get("transformer_step_ms") if key else None
            q = a / b if a and b else None
            out.append(f"- 1024x1024: DiT step / diffusers' transformer per step = {fmt(q)} (target <= 1.05): "
                       f"{verdict(None if q is None else q <= 1.05)}")  # fmt: skip
    for key, o in sorted(omni.items()):
        p = o.get("poisson", {}).get("0.9")
        if p and p.get("dit_step_ms_p50"):
            w, st = p["first_step_wait_p99_s"], p["dit_step_ms_p50"] / 1000
            out.append(f"- {key}, Poisson 90%: arrival -> first step p99 {w:.3f} s vs one step under that load "
                       f"{st:.3f} s: {verdict(w <= st)}")  # fmt: skip
    return out


def report(results: dict[str, Any], device: str) -> str:
    omni = results.get("omni", {}).get("sizes", {})
    hf = results.get("diffusers", {}).get("sizes", {})
    first = results.get("omni", results.get("diffusers", {}))
    guidance = 'on (negative prompt " ", scale 4)' if first.get("cfg", True) else "off"
    lines = [
        f"Qwen-Image, {first.get('mode', '?')}, one device: **{device}**; true CFG {guidance}.",
        *warmup_lines(results),
        "",
        "| size / steps | concurrent | omni_mp images/s | omni_mp latency mean (s) | diffusers images/s "
        "| diffusers latency mean (s) | omni_mp / diffusers one at a time |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(set(omni) | set(hf), key=lambda k: int(k.split("x")[0])):
        o, h = omni.get(key, {}), hf.get(key, {})
        base = h.get("levels", {}).get("1", {}).get("images_per_s")
        for c in sorted(set(o.get("levels", {})) | set(h.get("levels", {})), key=int):
            ol, hl = o.get("levels", {}).get(c, {}), h.get("levels", {}).get(c, {})
            ratio = ol["images_per_s"] / base if ol and base else None
            lines.append(
                f"| {key} | {c} | {fmt(ol.get('images_per_s'))} | {fmt(ol.get('latency_mean_s'), '{:.2f}')} | "
                f"{fmt(hl.get('images_per_s'))} | {fmt(hl.get('latency_mean_s'), '{:.2f}')} | {fmt(ratio, '{:.2f}x')} |"
            )
    lines += ["", "| size / steps | DiT step, 1 request (omni_mp) | transformer per step (diffusers) | ratio |",
              "|---|---|---|---|"]  # fmt: skip
    for key in sorted(set(omni) | set(hf), key=lambda k: int(k.split("x")[0])):
        a, b = omni.get(key, {}).get("dit_step_ms_one_request"), hf.get(key, {}).get("transformer_step_ms")
        lines.append(f"| {key} | {fmt(a, '{:.1f} ms')} | {fmt(b, '{:.1f} ms')} | {fmt(a / b if a and b else None)} |")
    lines += ["", "| size / steps | Poisson load | rate (images/s) | latency mean / p99 (s) "
              "| arrival -> first step mean / p99 (s) | DiT step p50: under this load / 1 request (s) "
              "| steps restarted (parts discarded) |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, o in sorted(omni.items(), key=lambda kv: int(kv[0].split("x")[0])):
        one = o.get("dit_step_ms_one_request")
        for frac, p in sorted(o.get("poisson", {}).items()):
            loaded = p.get("dit_step_ms_p50")
            lines.append(
                f"| {key} | {float(frac):.0%} of {o['capacity_images_per_s']:.3f}/s | {p['rate']:.3f} | "
                f"{p['latency_mean_s']:.2f} / {p['latency_p99_s']:.2f} | "
                f"{p['first_step_wait_mean_s']:.3f} / {p['first_step_wait_p99_s']:.3f} | "
                f"{fmt(loaded and loaded / 1000)} / {fmt(one and one / 1000)} | "
                f"{p.get('steps_restarted', '-')} ({fmt(p.get('restarted_parts_ms'), '{:.0f} ms')}) |"
            )
    lines += ["", "Targets (issue 21), as measured here:", *targets(omni, hf), "", ANCHORS]
    if "omni" in results:
        lines.append(f"\nomni_mp start to ready: {fmt(results['omni'].get('cold_start_s'), '{:.0f} s')}.")
    errors = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    if errors:
        lines.append(f"\nFailed phases: {errors}")
    return "\n".join(lines)


def _series(results: dict[str, Any], side: str, key: str) -> tuple[list[int], list[float]]:
    levels = results.get(side, {}).get("sizes", {}).get(key, {}).get("levels", {})
    cs = sorted(levels, key=int)
    return [int(c) for c in cs], [levels[c]["images_per_s"] for c in cs]


def warmup_lines(results: dict[str, Any]) -> list[str]:
    """How each side's levels were warmed up (the per-level records of benchmarks.common.warmup)."""
    lines = []
    for side, label, how in (("omni", "omni_mp", WARMUP_OMNI), ("diffusers", "diffusers", WARMUP_DIFFUSERS)):
        res = results.get(side, {})
        levels = {
            f"{key} c={c}": lv["warmup"]
            for key, size in res.get("sizes", {}).items()
            for c, lv in size.get("levels", {}).items()
            if "warmup" in lv
        }
        line = warmup_line({"how": res.get("warmup_how", how), "levels": levels}, label) if levels else None
        if line:
            lines.append(line)
    return lines


def plot(results: dict[str, Any], path_stem: Path, device: str) -> Path:
    """images/s against concurrency, one panel per size: PNG with matplotlib, else SVG by hand."""
    keys = sorted({k for side in ("omni", "diffusers") for k in results.get(side, {}).get("sizes", {})},
                  key=lambda k: int(k.split("x")[0]))  # fmt: skip
    plt = pyplot()
    if plt is None:
        return _svg(results, keys, path_stem.with_suffix(".svg"), device)
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(5 * max(1, len(keys)), 4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=False):
        for side, style in (("omni", "o-"), ("diffusers", "s--")):
            xs, ys = _series(results, side, key)
            if xs:
                ax.plot(xs, ys, style, label="omni_mp" if side == "omni" else "diffusers")
        ax.set(title=key, xlabel="concurrent requests", ylabel="images/s", xscale="log")
        ax.legend()
    fig.suptitle(f"Qwen-Image (random weights) on {device}")
    fig.tight_layout()
    path = path_stem.with_suffix(".png")
    fig.savefig(path, dpi=120)
    return path


def _svg(results: dict[str, Any], keys: list[str], path: Path, device: str) -> Path:
    w, h, pad = 360, 260, 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * max(1, len(keys))}" height="{h + 30}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="8" y="14">Qwen-Image on {device}: images/s by concurrency</text>']  # fmt: skip
    for i, key in enumerate(keys):
        x0, series = i * w, {s: _series(results, s, key) for s in ("omni", "diffusers")}
        cs = sorted({c for xs, _ in series.values() for c in xs}) or [1]
        top = max([y for _, ys in series.values() for y in ys] or [1.0]) * 1.1

        def px(c: int, x0: float = x0, cs: list[int] = cs) -> float:
            return x0 + pad + (w - 2 * pad) * (cs.index(c) / max(1, len(cs) - 1))

        def py(y: float, top: float = top) -> float:
            return 30 + (h - pad) * (1 - y / top)

        parts.append(f'<text x="{x0 + pad}" y="28">{key}  (max {top / 1.1:.3f} images/s)</text>')
        parts.append(f'<line x1="{x0 + pad}" y1="{h - 10}" x2="{x0 + w - pad}" y2="{h - 10}" stroke="black"/>')
        for c in cs:
            parts.append(f'<text x="{px(c) - 4:.0f}" y="{h + 5}">{c}</text>')
        for side, color in (("omni", "#1f77b4"), ("diffusers", "#d62728")):
            xs, ys = series[side]
            if xs:
                pts = " ".join(f"{px(c):.1f},{py(y):.1f}" for c, y in zip(xs, ys, strict=True))
                parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
                parts.append(f'<text x="{px(xs[-1]) - 50:.0f}" y="{py(ys[-1]) - 6:.0f}" fill="{color}">'
                             f'{"omni_mp" if side == "omni" else "diffusers"}</text>')  # fmt: skip
    parts.append("</svg>")
    path.write_text("\n".join(parts))
    return path


# ---- orchestration ------------------------------------------------------------------------------
def preflight(args: argparse.Namespace, wanted: list[str]) -> list[str]:
    import importlib.util

    need = {"torch": "everything", "transformers": "the text encoder", "diffusers": "the DiT, VAE and baseline",
            "safetensors": "the checkpoint", "yaml": "the pipeline config"}  # fmt: skip
    if "omni" in wanted:
        need.update({"vllm": "the text-encoder stage", "zmq": "omni_mp", "msgspec": "omni_mp"})
    missing = [f"python module {m!r} (for {why})" for m, why in need.items() if importlib.util.find_spec(m) is None]
    for name in ("tiny_qwen_image.yaml", "qwen_image.yaml"):
        if not (CONFIG_DIR / name).is_file():
            missing.append(f"omni_mp/stage_configs/{name} (the Qwen-Image family's pipeline)")
    return missing


def merge_into(path: Path, new: dict[str, Any]) -> None:
    """A phase's result, merged into what earlier invocations wrote: per size, concurrency
    levels and Poisson loads add up (a level measured again replaces the old one); other
    numbers are the newest measured."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    if "error" not in old:
        sizes = old.get("sizes", {})
        for key, res in new.get("sizes", {}).items():
            was = sizes.get(key, {})
            merged = {**was, **{k: v for k, v in res.items() if v is not None}}
            for part in ("levels", "poisson"):
                merged[part] = {**was.get(part, {}), **res.get(part, {})}
            sizes[key] = merged
        new["sizes"] = sizes
    path.write_text(json.dumps(new, indent=1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("512:20,1024:50"), help="SIDE:STEPS,...")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 4, 16])
    p.add_argument("--rounds", type=int, default=1, help="requests per level = rounds x concurrency (c=1: >= 2)")
    p.add_argument("--poisson", type=lambda s: [float(x) for x in s.split(",") if x], default=[0.5, 0.9],
                   help="Poisson loads as fractions of the capacity measured (omni only; '' for none)")  # fmt: skip
    p.add_argument("--poisson-requests", type=int, default=16)
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="warm-up rounds per level before it is measured: N x c unmeasured requests with c in flight (diffusers: "
        "N calls of c prompts); 0: none",
    )
    p.add_argument("--no-step-timing", dest="step_timing", action="store_false",
                   help="diffusers: skip the synchronized per-step transformer timing run")  # fmt: skip
    p.add_argument("--capacity", type=lambda s: {k: float(v) for k, v in (x.split("=") for x in s.split(",") if x)},
                   default={}, help="SIDExSIDE/STEPS=IMAGES_PER_S,...: the capacity for Poisson loads (default: "
                   "the best images/s measured in this run)")  # fmt: skip
    p.add_argument("--no-cfg", dest="cfg", action="store_false", help="no negative prompt (one pass per step)")
    p.add_argument(
        "--blocks-per-part",
        type=int,
        help="the DiT's blocks per engine step (0: whole steps; default: the stage config's)",
    )
    p.add_argument("--restart-step-before", type=float, help="diffusion.restart_step_before (default: the config's)")
    p.add_argument("--encoder-share", type=float, default=0.25, help="the text encoder's gpu_memory_utilization")
    p.add_argument("--tiny", action="store_true", help="CPU, the tiny checkpoint: a check that every phase runs")
    p.add_argument("--shrink", action="store_true", help="CPU, the real path at toy widths: a check of this script")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "image_gpu-models")
    p.add_argument("--out", type=Path, default=phases.REPO / "outputs" / "image_gpu")
    p.add_argument("--phase-timeout-s", type=float, default=3000)
    p.add_argument("--deadline-s", type=float, help="the whole invocation's limit: phases that cannot start skip")
    args = p.parse_args(argv)
    if args.tiny or args.shrink:
        given = argv or sys.argv
        if "--sizes" not in given:
            args.sizes = parse_sizes("64:3")
        if "--concurrency" not in given:
            args.concurrency = [1, 2]
        if "--poisson-requests" not in given:
            args.poisson_requests = 4
    return args


def main() -> int:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase:  # a child: one phase (omni and diffusers merge into what earlier runs wrote)
        result = args.out / f"{args.phase}.json"
        if args.phase == "build":
            ckpt = checkpoint_dir(args)
            build = (lambda: {"skipped": "tiny"}) if args.tiny else (lambda: build_qwen_image_dir(ckpt, args.shrink))
            return phases.run_child_phase(result, build)
        run = run_omni if args.phase == "omni" else run_diffusers
        return phases.run_child_phase(result, lambda: run(args), lambda data: merge_into(result, data))
    todo = phases.split_phases(args.phases, PHASES)
    if todo:
        missing = preflight(args, todo)
        if missing:
            say("PREFLIGHT FAILED, this host lacks:")
            for m in missing:
                say(f"  - {m}")
            return 2
    deadline = T_START + args.deadline_s if args.deadline_s else None
    for phase in todo:
        phases.run_phase_process(
            "benchmarks.image_gpu", phase, args.out, timeout_s=args.phase_timeout_s, say=say, deadline=deadline,
            margin_s=RENDER_MARGIN_S, min_s=20, write_errors=phase != "build",
        )  # fmt: skip
    results = phases.phase_results(args.out, PHASES)
    device = phases.devices_of(results)
    text = report(results, device)
    (args.out / "image_gpu.json").write_text(json.dumps({"device": device, "results": results}, indent=1))
    figure = plot(results, args.out / "image_gpu", device)
    (args.out / "image_gpu.md").write_text(text + f"\n\n![images/s]({figure.name})\n")
    print("\n" + text, flush=True)
    say(f"wrote {args.out / 'image_gpu.md'}, {figure.name} and image_gpu.json")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

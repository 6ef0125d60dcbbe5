"""Qwen2.5-Omni at 7B shapes (random weights): omni_mp's thinker -> talker -> token2wav against
transformers (issue 12).

The pipeline is omni_mp/stage_configs/qwen2_5_omni.yaml's, on a config-only checkpoint dir
(omni_mp/models/qwen2_5_omni/shapes.py) at the released Qwen2.5-Omni-7B sizes: transformers'
default thinker and token2wav, and the released talker (hidden 896, 24 layers, 12 attention heads,
4 KV heads, head_dim 128, intermediate 18944, vocab 8448, embedding 3584). `--talker default`
keeps transformers' default talker config instead (thinker-sized: hidden 3584, 28 layers).
  stage 0 thinker   vLLM's Qwen2.5-Omni thinker, `load_format: dummy`, hidden states streamed;
  stage 1 talker    `model_part: talker` (our vLLM talker from a view of the dir), processor
                    qwen2_5_omni_talker, `load_format: dummy`;
  stage 2 token2wav `kind: diffusion`, processor codec_tokens, the dir's random fp32 tensors
                    (CUDA graphs per batch/length bucket unless --token2wav-graphs off).
Fixed lengths: every request has a distinct random prompt of --prompt-len ids (checked), the
thinker writes exactly --thinker-tokens tokens (`ignore_eos`), the talker exactly --talker-codes
codes (`suppress_token_ids` = every talker id >= 8192: its control ids, so it never stops on
pad/end and token2wav gets only real codec ids; 50 codes = 1 s of audio). Every request's audio
length and thinker token count are checked against those (a round that differs fails).

Phases, each in a fresh subprocess (GPU memory returned between them, each with an empty vLLM
compile cache unless --compile-cache shared); each writes `<out>/<phase>.json`, and the report
is made from every phase file in `--out`, so phases can run in separate invocations:
  hf        transformers `Qwen2_5OmniForConditionalGeneration` built from the same config on the
            GPU in bf16 (token2wav fp32), `generate()` with the same fixed lengths: one request
            at a time, then batched (up to --hf-max-batch). No streaming: first audio = end.
  stream    omni_mp, streaming between stages: cold start (stages start in parallel) to
            Ready; per concurrency level, in order: one unmeasured warm-up round at that level
            (its batch shapes' first runs: benchmarks.common.warmup), then --rounds measured
            rounds: time to first audio chunk (p50/p90), RTF, audio seconds per second, thinker
            tokens/s;
            the thinker -> talker transport per step from the stage timelines
            (OMNI_MP_PROFILE_DIR): thinker build + send and wire bytes, talker receive +
            decode and handling (p50, microseconds), at the highest concurrency.
  nostream  the same with `wait_for_upstream: true` on the talker and token2wav (each starts a
            request when its upstream finished it; token2wav still emits its audio in chunks).
  cold0, cold1, cold2   each stage alone (same config): time to Ready.
Outputs in --out: omni_gpu.json, omni_gpu.md (the table), omni_gpu.png (if matplotlib is
there; the report says when it is not). `--phases ''` only re-renders the report.
Preflight: the script first lists any missing module (vllm, zmq, msgspec, torchvision,
transformers, safetensors) or omni_mp piece and exits 2.

On the lent GPU machines (no network; vLLM 0.25.0, pyzmq, msgspec from the GPU host recipe's
wheel carry, scripts/gpu/; the image has torch 2.11.0, torchvision 0.26.0, transformers 5.17.0
and matplotlib). Every command below is one device call, under the 10-minute limit:
ENV = export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn HF_HUB_OFFLINE=1

(a) --gpus 1, one H200 (kind nvidia-h200): all three stages on GPU 0 with memory budgets
    0.42 / 0.38 / 0.12 of the GPU (thinker / talker / token2wav: ~59 / 53 / 17 GiB of an H200;
    the budget check needs ~16 / 14 / 4 GiB), two calls, back to back on the warm machine:
  A  (with the last wheel chunk: install, then)
     $ENV && python3 -m benchmarks.omni_gpu --gpus 1 --phases stream,nostream --deadline-s 530 --out $OUT/omni_gpu
     per phase a cold start with compile (~100-130 s; the three engines start in parallel),
     then at each of 1, 8, 32, 64 a warm-up round and a measured round (~60-90 s for the
     measured ones, token2wav-bound at 64; before per-level warm-ups the whole call took ~7-8
     min with one warm-up round of 64: the warm-ups at 1, 8 and 32 add about their levels'
     time, so a call that runs out of --deadline-s splits the phases: --phases stream, then
     --phases nostream).
  B  (carry ["outputs/omni_gpu"] holding call A's stream.json and nostream.json, so the report
     merges all phases and plots with the image's matplotlib)
     $ENV && mkdir -p $OUT && cp -r outputs/omni_gpu $OUT/ && python3 -m benchmarks.omni_gpu --gpus 1 \
       --phases hf,cold0,cold1,cold2 --deadline-s 570 --out $OUT/omni_gpu
     ~6-7 min: transformers (~1.5-2 min: build, warm-up, one request, batch of 8), then each
     stage alone (~2 min for the thinker and the talker each with compile, ~40 s token2wav).
     If the machine went back between A and B, redo the wheel carry and install first.
(b) --gpus 2 (kind nvidia-h200-x2: thinker on GPU 0; talker + token2wav on GPU 1 with budgets
    0.7 / 0.15 of it, the thinker 0.85 of GPU 0): the same two calls with `--gpus 2`.
Locally, to re-render from fetched phase files: python -m benchmarks.omni_gpu --gpus N --phases '' --out DIR
CPU check of every phase at tiny sizes (the 7B-shape config scaled down 28x, the same dummy
load path for all three stages; ~5 min on 2 cores):
  PYTHONPATH=$PWD python -m benchmarks.omni_gpu --smoke --out /tmp/omni_smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.checkpoints import (
    QWEN2_5_CODEC_IDS,
    QWEN2_5_SAMPLES_PER_CODE,
    qwen2_5_omni_dir,
    qwen2_5_omni_spec,
)
from benchmarks.common.peer_report import peer_docs, peer_table
from benchmarks.common.phases import (
    REPO,
    add_gpu_sharing_arg,
    device_name,
    devices_of,
    int_list,
    phase_results,
    run_child_phase,
    run_phase_process,
    split_phases,
)
from benchmarks.common.replica_layouts import LAYOUTS, apply_layout, scaling_lines
from benchmarks.common.report import make_say, ms, pyplot
from benchmarks.common.rounds import SAMPLE_RATE, check_round, measure_levels, playback_line, token_prompts
from benchmarks.common.timelines import (
    Timelines,
    burst_path,
    burst_path_line,
    critical_path,
    critical_path_line,
    read_timelines,
    stage_step_summary,
    stage_steps_table,
    transport_summary,
)
from benchmarks.common.token2wav_options import T2W_COMPILE, T2W_DTYPES, use_precision
from benchmarks.common.warmup import Warmups, warmup_line, warmup_seed

PHASES = ["hf", "stream", "nostream", "cold0", "cold1", "cold2", "t2w_tf32"]
T_START = time.perf_counter()
RENDER_MARGIN_S = 15  # kept at the end of --deadline-s for the report
CODEC_IDS = QWEN2_5_CODEC_IDS  # real codec ids; the rest of the talker's 8448 are control ids (pad, bos, eos, ...)
SAMPLES_PER_CODE = QWEN2_5_SAMPLES_PER_CODE
# Memory budgets of thinker / talker / token2wav as fractions of a device, per layout.
# transformers' default talker is as wide as the thinker, so they get similar shares; token2wav
# has no KV cache. With --gpus 2 the talker and token2wav share GPU 1: budgets there too, so
# the talker's KV cache does not take a fixed 90% of it while token2wav loads beside it.
SHARES = {1: (0.42, 0.38, 0.12), 2: (0.85, 0.7, 0.15)}
# token2wav's least budget: its fp32 weights, the CUDA graphs warmed up to a batch of 64 windows
# (4.1 GiB of pools) and the activations of 64 windows' steps. Its 12% of an H100 (9.6 GiB,
# 8.6 usable) ran out of memory at 64 requests (TF32, 2026-11-27); an H200's 16.8 GiB serves.
T2W_MIN_GIB = 16.0


say = make_say("omni_gpu")
prompts = token_prompts


def model_dir(args: argparse.Namespace) -> Path:
    """The one model dir of every system here (vllm-omni too: benchmarks.peer_vllm_omni)."""
    return qwen2_5_omni_dir(args.work_dir, args.smoke, args.talker)


def audio_s(args: argparse.Namespace) -> float:
    """Every request's audio: --talker-codes codes."""
    return args.talker_codes * SAMPLES_PER_CODE / SAMPLE_RATE


# ---- transformers -----------------------------------------------------------------------------
def run_hf(args: argparse.Namespace) -> dict[str, Any]:
    """transformers' generate(): one request at a time (after an unmeasured one), then each
    batch size up to --hf-max-batch, each after an unmeasured batch of its size."""
    generate, build_s = hf_generate(args)
    out: dict[str, Any] = {"build_s": build_s, "device": device_name()}
    warmups = Warmups("one unmeasured generate() of each level's batch before it is measured")
    t0 = time.time()
    generate(prompts(1, args.prompt_len, 7))  # warm-up
    warmups.warmed(1, t0, 1)
    walls, audio = [], 0.0
    for r in range(args.rounds):
        t_round = time.time()
        wall, audio = generate(prompts(1, args.prompt_len, 100 + r))
        warmups.measured(1, t_round)
        walls.append(wall)
        say(f"hf: one request {wall:.2f}s, {audio:.2f}s of audio")
    one = statistics.median(walls)
    n = args.thinker_tokens
    out["single"] = {"wall_s": one, "walls": walls, "audio_s": audio, "thinker_tok_s": n / one, "rtf": one / audio}
    batched: dict[str, Any] = {}
    for c in args.concurrency:
        if c == 1 or c > args.hf_max_batch:
            continue
        try:
            t0 = time.time()
            generate(prompts(c, args.prompt_len, warmup_seed(c)))  # this batch size's first run, not measured
            warmups.warmed(c, t0, c)
            t_round = time.time()
            wall, audio_b = generate(prompts(c, args.prompt_len, 1000 + c))
            warmups.measured(c, t_round)
        except Exception as err:  # noqa: BLE001 - recorded in the report: batching is optional
            batched[str(c)] = {"error": f"{type(err).__name__}: {err}"[:500]}
            say(f"hf: batch {c} failed: {batched[str(c)]['error']}")
            break
        batched[str(c)] = {"wall_s": wall, "audio_s": audio_b, "thinker_tok_s": c * n / wall}
        say(f"hf: batch {c} {wall:.2f}s")
    out["batched"] = batched
    out["warmup"] = warmups.to_json()
    return out


def hf_generate(args: argparse.Namespace) -> tuple[Any, float]:
    """transformers' Qwen2.5-Omni built from the benchmark's config on the GPU (bf16, token2wav
    fp32), and `generate(batch) -> (wall s, audio s)` at the fixed lengths (checked); the build's
    seconds."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList, Qwen2_5OmniForConditionalGeneration

    from omni_mp.models.qwen2_5_omni.shapes import omni_shapes_config

    class RealCodecsOnly(LogitsProcessor):
        """Random weights may pick any of the 8448 talker ids; token2wav embeds only the real
        codec ids, and EOS is ignored anyway (min_new_tokens), so the rest are masked."""

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            scores[:, CODEC_IDS:] = -float("inf")
            return scores

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = omni_shapes_config(qwen2_5_omni_spec(args.smoke, args.talker))
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5OmniForConditionalGeneration._from_config(config, dtype=dtype)
    model.token2wav.float()  # as transformers runs it
    model.eval()
    model.load_speakers(str(model_dir(args) / "spk_dict.pt"))
    build_s = time.perf_counter() - t0
    say(f"hf: model built on {device} in {build_s:.1f}s")
    n, t = args.thinker_tokens, args.talker_codes
    gen_kwargs = {
        "speaker": "Chelsie",
        "thinker_max_new_tokens": n,
        "thinker_min_new_tokens": n,
        "thinker_do_sample": False,
        "talker_max_new_tokens": t,
        "talker_min_new_tokens": t,
        "talker_logits_processor": LogitsProcessorList([RealCodecsOnly()]),
    }

    def generate(batch: list[list[int]]) -> tuple[float, float]:
        ids = torch.tensor(batch, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            _, wav = model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        wavs = wav if isinstance(wav, list) else [wav]
        audio = sum(w.numel() for w in wavs) / SAMPLE_RATE
        if abs(audio - len(batch) * audio_s(args)) > 1e-6:  # the same audio on every system
            raise RuntimeError(f"transformers made {audio:.3f} s of audio for {len(batch)} x {t} codes")
        return wall, audio

    return generate, build_s


# ---- omni_mp ----------------------------------------------------------------------------------
REQUIRED = {  # module -> what needs it
    "vllm": "every omni_mp AR stage (vLLM 0.25.0)",
    "zmq": "omni_mp's transport (pyzmq)",
    "msgspec": "omni_mp's wire format",
    "torchvision": "vLLM's Qwen2.5-Omni thinker (its processor module imports it)",
    "transformers": "the baseline and the configs",
    "safetensors": "token2wav weights",
}


def preflight(args: argparse.Namespace) -> list[str]:
    """What this host lacks for the phases asked for, one line each (empty: all there)."""
    import importlib.util

    phases = set(filter(None, args.phases.split(",")))
    need = dict(REQUIRED)
    if phases <= {"hf"}:
        need = {k: v for k, v in need.items() if k in ("transformers", "safetensors")}
    missing = [f"python module {m!r} (for {why})" for m, why in need.items() if importlib.util.find_spec(m) is None]
    if not missing and phases - {"hf"}:
        from omni_mp.config.schema import StageConfig
        from omni_mp.models import registry
        from omni_mp.wire.messages import SamplingParamsMsg

        if "qwen2_5_omni_talker" not in registry.names("processors"):
            missing.append("omni_mp processor qwen2_5_omni_talker")
        for field in ("model_part", "wait_for_upstream"):
            if field not in StageConfig.__struct_fields__:
                missing.append(f"omni_mp stage field {field}")
        if "suppress_token_ids" not in SamplingParamsMsg.__struct_fields__:
            missing.append("omni_mp SamplingParamsMsg.suppress_token_ids")
    if importlib.util.find_spec("transformers") is not None and "hf" in phases:
        import transformers

        if not hasattr(transformers, "Qwen2_5OmniForConditionalGeneration"):
            missing.append(f"transformers {transformers.__version__} has no Qwen2_5OmniForConditionalGeneration")
    return missing


def budgets_gib(args: argparse.Namespace) -> list[float]:
    if args.budgets_gib:
        return [float(x) for x in args.budgets_gib.split(",")]
    from omni_mp.control.memory_budget import GiB, query_devices

    devices = query_devices()
    if not devices or any(d not in devices for d in range(args.gpus)):
        raise SystemExit(f"--gpus {args.gpus} needs GPUs 0..{args.gpus - 1} to size the budgets (or --budgets-gib)")
    return split_budgets(devices[0].total_bytes / GiB, args.gpus)


def device_total_gib() -> float:
    """GPU 0's size (the layouts' budgets are shares of it)."""
    from omni_mp.control.memory_budget import GiB, query_devices

    devices = query_devices()
    if not devices:
        raise SystemExit("--layout needs a GPU to size the budgets")
    return devices[0].total_bytes / GiB


def split_budgets(total_gib: float, gpus: int) -> list[float]:
    """Thinker / talker / token2wav budgets (GiB) on a device of `total_gib`: SHARES, with
    token2wav at T2W_MIN_GIB at least, taken from the stages beside it on its GPU (on one GPU
    the thinker and talker, in their shares' ratio; on two the talker)."""
    thinker, talker, t2w = SHARES[gpus]
    t2w_gib = max(t2w * total_gib, T2W_MIN_GIB)
    if gpus == 1:
        rest = (thinker + talker + t2w) * total_gib - t2w_gib
        split = [rest * thinker / (thinker + talker), rest * talker / (thinker + talker), t2w_gib]
    else:
        split = [thinker * total_gib, (talker + t2w) * total_gib - t2w_gib, t2w_gib]
    return [round(b, 1) for b in split]


def talker_suppressed(model: Path) -> list[int]:
    """The talker ids token2wav must never get: every id from CODEC_IDS up (the talker's control
    ids: codec pad, bos, end, mask, ...). Suppressing pad and end also means a random talker
    never stops early: every request makes exactly max_tokens codes."""
    config = json.loads((model / "config.json").read_text())
    vocab = int(config["talker_config"]["vocab_size"])
    num_embeds = int(config["token2wav_config"]["dit_config"]["num_embeds"])
    assert num_embeds >= CODEC_IDS, f"token2wav embeds only {num_embeds} codec ids"
    return list(range(CODEC_IDS, vocab))


def omni_pipeline(args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """The pipeline of omni_mp/stage_configs/qwen2_5_omni.yaml's shape at the benchmark's sizes:
    thinker (hidden states) -> talker (model_part: talker) -> token2wav, random weights
    (`load_format: dummy`; token2wav's random tensors are in the dir), fixed lengths."""
    from omni_mp.models.qwen2_5_omni.shapes import thinker_engine_args

    model = model_dir(args)
    conc = max(args.concurrency)
    if args.smoke:  # CPU: fp32, eager, no devices and no budgets
        devs: list[list[int]] = [[], [], []]
        common: dict[str, Any] = {"dtype": "float32", "enforce_eager": True}
    else:
        devs = [[0], [1], [1]] if args.gpus == 2 else [[0], [0], [0]]
        common = {"dtype": "bfloat16"}
    common.update({"seed": 0, "max_num_seqs": conc, "enable_prefix_caching": False})
    thinker = {
        "id": 0, "model": str(model), "devices": devs[0], "hidden_states": {},
        "engine_args": {**common, **thinker_engine_args(), "max_model_len": args.prompt_len + args.thinker_tokens + 64},
        "sampling": {"temperature": 0.0, "ignore_eos": True, "max_tokens": args.thinker_tokens},
    }  # fmt: skip
    talker = {
        "id": 1, "model": str(model), "model_part": "talker", "devices": devs[1], "inputs": [0],
        "processor": "qwen2_5_omni_talker",
        "engine_args": {**common, "load_format": "dummy", "max_model_len": args.prompt_len + args.talker_codes + 64},
        "sampling": {
            "temperature": 0.0, "ignore_eos": True, "max_tokens": args.talker_codes,
            "suppress_token_ids": talker_suppressed(model),
        },
    }  # fmt: skip
    token2wav = {
        "id": 2, "model": str(model), "kind": "diffusion", "devices": devs[2], "inputs": [1],
        "processor": "codec_tokens", "final_output": True, "engine_args": {"max_model_len": 4096},
        "sampling": {"seed": 0},
        "diffusion": {
            # 64 whatever levels run: a run of one level measures the pipeline a run of all levels does
            "default_speaker": "Chelsie", "max_batch": 64, "float32_matmul": args.token2wav_matmul,
            "cuda_graphs": args.token2wav_graphs == "on", "model_options": t2w_options(args),
        },
    }  # fmt: skip
    streaming = {
        k: v
        for k, v in (
            ("first_chunk", args.token2wav_first_chunk),
            ("chunk", args.token2wav_chunk),
            ("max_chunk", args.token2wav_max_chunk),
            ("max_chunks_in_flight", args.token2wav_chunks_in_flight),
        )
        if v
    }
    if streaming:
        token2wav["diffusion"]["streaming"] = streaming  # type: ignore[index]
    stages = [thinker, talker, token2wav]
    if not stream:
        talker["wait_for_upstream"] = token2wav["wait_for_upstream"] = True
    if args.smoke:
        apply_layout(stages, args.layout, None, None)
    else:
        for s, gib in zip(stages, budgets_gib(args), strict=True):
            s["memory"] = {"gpu_gib": gib}
        if args.layout != "split":
            if args.gpus != 2:
                raise SystemExit(f"--layout {args.layout} needs --gpus 2")
            total = device_total_gib()
            apply_layout(stages, args.layout, split_budgets(total, 1), split_budgets(total, 2))
        token2wav["mps_priority"] = args.token2wav_priority
        talker["mps_priority"] = args.talker_priority
        thinker["mps_priority"] = args.thinker_priority
        for s, share in zip(stages, args.sm_percent, strict=True):
            if share is not None:
                s["mps_sm_percent"] = share
        if args.ar_quantization != "none":  # vLLM quantizes the bf16 weights as it loads them
            for s in (thinker, talker):
                s["engine_args"]["quantization"] = args.ar_quantization  # type: ignore[index]
    # checked against vLLM's EngineArgs with the rest of the config
    thinker["engine_args"].update(args.thinker_engine_args)  # type: ignore[union-attr]
    talker["engine_args"].update(args.talker_engine_args)  # type: ignore[union-attr]
    return {
        "name": "qwen2_5_omni_bench",
        "timeouts": {"stage_startup_s": 900},
        "gpu_sharing": {"mode": args.gpu_sharing},
        "stages": stages,
    }


def profile_windows(text: str) -> list[tuple[int, int, int]]:
    """--torch-profile "STAGE:FIRST:STEPS[,...]" -> (stage, first step, steps) per window."""
    windows = []
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) != 3 or not all(f.strip().isdigit() for f in fields):
            raise argparse.ArgumentTypeError(f"{part!r}: want STAGE:FIRST_STEP:STEPS, three whole numbers")
        stage, first, steps = (int(f) for f in fields)
        windows.append((stage, first, steps))
    return windows


def sm_percents(text: str) -> list[int | None]:
    """--sm-percent "T,K,W" -> each stage's MPS share of the SMs (None: all of them), checked as
    the arguments are parsed, not in the phase process that builds the pipeline."""
    parts = text.split(",")
    try:
        shares = [int(p) if p.strip() else None for p in parts]
    except ValueError:
        shares = []
    if len(parts) != 3 or len(shares) != 3 or any(v is not None and not 1 <= v <= 100 for v in shares):
        raise argparse.ArgumentTypeError(f"three percentages 1-100 or empty (thinker,talker,token2wav), got {text!r}")
    return shares


def run_pipeline(args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """One streaming (or not) phase: the pipeline's cold start, each level warmed up and then
    measured (`measure_levels`), and what the stage timelines say of the measured rounds."""
    from omni_mp.config.validate import parse_config
    from omni_mp.control.embedded import embedded_pipeline

    name = "stream" if stream else "nostream"
    cfg = parse_config(omni_pipeline(args, stream))
    profile_dir = profile_to(Path(tempfile.mkdtemp(prefix="omni_gpu-profile-")), args)
    out: dict[str, Any] = {"pipeline": cfg.name, "device": device_name()}
    out["budgets_gib"] = [s.memory.gpu_gib for s in cfg.stages if s.memory is not None]
    t0 = time.perf_counter()
    with embedded_pipeline(cfg, progress=say) as coord:
        out["cold_start_s"] = time.perf_counter() - t0
        out["gpu_sharing"] = coord.sharing_note
        say(f"{name}: pipeline ready in {out['cold_start_s']:.1f}s")
        levels, windows, warmups = measure_levels(
            coord.client_endpoint,
            args.concurrency,
            args.rounds,
            lambda c, seed: prompts(c, args.prompt_len, seed),
            lambda batch, reqs: check_round(batch, reqs, args.thinker_tokens, audio_s(args)),
            say,
            name,
        )
    out.update(levels)
    out["warmup"] = warmups.to_json()
    # the stage processes have exited: their timelines are written
    out.update(timeline_summaries(read_timelines(profile_dir, earliest(windows)), windows, args))
    shutil.copytree(profile_dir, args.out / f"profile-{name}", dirs_exist_ok=True)
    shutil.rmtree(profile_dir, ignore_errors=True)  # copied to --out
    return out


def profile_to(profile_dir: Path, args: argparse.Namespace) -> Path:
    """The stage processes (which inherit this environment) write their step timelines to
    `profile_dir`, and with --torch-profile their PyTorch profiles beside them."""
    import msgspec

    from omni_mp.stage.timeline import PROFILE_DIR_ENV
    from omni_mp.stage.torch_profile import TORCH_PROFILE_ENV, ProfileWindow

    os.environ[PROFILE_DIR_ENV] = str(profile_dir)
    if args.torch_profile:  # the reports land beside the timelines, in <out>/profile-<phase>
        windows = [ProfileWindow(str(profile_dir), *w) for w in args.torch_profile]
        os.environ[TORCH_PROFILE_ENV] = msgspec.json.encode(windows).decode()
    return profile_dir


def earliest(windows: dict[int, tuple[float, float]]) -> float:
    """When the first measured round began (0 where none was)."""
    return min((t0 for t0, _ in windows.values()), default=0.0)


def timeline_summaries(
    timelines: Timelines, windows: dict[int, tuple[float, float]], args: argparse.Namespace
) -> dict[str, Any]:
    """The transport per step in the last round, each stage's steps per level, one request's
    path at concurrency 1 and every burst's at the levels above."""
    last = max(windows.values(), default=(0.0, 0.0))[0]
    out: dict[str, Any] = {
        "transport": transport_summary(timelines, last),
        "stage_steps": stage_step_summary(timelines, windows),
    }
    if 1 in windows:
        out["critical_path_c1"] = critical_path(timelines, windows[1], first_audio_codes(args))
    out["burst_paths"] = {
        str(c): burst_path(timelines, w, c, first_audio_codes(args)) for c, w in windows.items() if c > 1
    }
    return out


def run_t2w_precision(args: argparse.Namespace) -> dict[str, Any]:
    """token2wav at the benchmark's size on the GPU, one request of --talker-codes codes, the
    same noise: exact fp32 matmuls vs TF32 ("high"): time and the waveform's relative L2
    difference. What `diffusion.float32_matmul: high` trades for speed."""
    import torch
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    from omni_mp.models.checkpoint import load_prefixed
    from omni_mp.models.qwen2_5_omni.speakers import load_speakers

    path = model_dir(args)
    config = Qwen2_5OmniConfig.from_pretrained(path).token2wav_config
    with torch.device("cuda"):
        t2w = Qwen2_5OmniToken2WavModel._from_config(config, dtype=torch.float32).eval()
    t2w.load_state_dict(load_prefixed(path, "token2wav."), strict=False)
    spk = load_speakers(path)["Chelsie"]
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, config.dit_config.num_embeds, (1, args.talker_codes), generator=gen).cuda()
    out: dict[str, Any] = {"codes": args.talker_codes}
    wavs = {}
    for precision in ("highest", "high", "highest", "high"):  # the first pair warms up
        use_precision(precision)
        torch.manual_seed(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            wav = t2w(codes, spk["cond"].cuda().float(), spk["ref_mel"].cuda().float())
        torch.cuda.synchronize()
        out[f"{precision}_s"] = time.perf_counter() - t0
        wavs[precision] = wav.float().cpu()
    a, b = wavs["highest"], wavs["high"]
    out["rel_l2"] = float((a - b).norm() / a.norm())
    say(f"t2w_tf32: {args.talker_codes} codes: fp32 {out['highest_s']:.3f}s, TF32 {out['high_s']:.3f}s, "
        f"rel. L2 difference {out['rel_l2']:.2e}")  # fmt: skip
    del t2w
    torch.cuda.empty_cache()
    out["engine"] = t2w_engine_precisions(path, codes[0].cpu())
    return out


def t2w_engine_precisions(path: Path, codes: Any) -> dict[str, dict[str, float]]:
    """The stage's own token2wav model (omni_mp's Token2WavModel through the diffusion runner,
    eager, one-shot, the same seed) in each precision a config can choose, against exact fp32:
    time (the best of 3) and the waveform's relative L2 difference, SNR and max |diff|."""
    import torch

    from omni_mp.engines.diffusion.batcher import StepPlan, TrajectorySpec
    from omni_mp.engines.diffusion.chunking import one_shot
    from omni_mp.engines.diffusion.model import Window
    from omni_mp.engines.diffusion.params import DiffusionParams
    from omni_mp.engines.diffusion.runner import DiffusionRunner
    from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a check of this code

    def one_shot_wav(model: Token2WavModel) -> tuple[Any, float]:
        best, wav = float("inf"), None
        for _ in range(3):
            runner = DiffusionRunner(model, crossfade=0)
            win = Window("r", codes, 0, DiffusionParams(seed=0, speaker="Chelsie"))
            plan = StepPlan([TrajectorySpec(0, win, one_shot(codes.numel()))], [0], [], 1)
            t0 = time.perf_counter()
            while True:
                result = runner.execute(plan)  # the output's copy to the CPU syncs
                if result.outputs:
                    wav = result.outputs["r"][0]
                    break
                plan = StepPlan([], [0], [], 1)
            best = min(best, time.perf_counter() - t0)
        return wav, best

    eager = T2W_COMPILE["off"]
    variants = {  # name: (float32 matmul precision, model options)
        "fp32": ("highest", eager),
        "TF32": ("high", eager),
        "TF32 + bf16 DiT": ("high", {**T2W_DTYPES["bfloat16-dit"], **eager}),
        "TF32 + bf16 DiT and vocoder": ("high", {**T2W_DTYPES["bfloat16"], **eager}),
        "fp32, compiled": ("highest", T2W_COMPILE["all"]),
        "TF32, compiled": ("high", T2W_COMPILE["all"]),
        "TF32 + bf16 DiT, compiled": ("high", {**T2W_DTYPES["bfloat16-dit"], **T2W_COMPILE["all"]}),
    }
    ref, ref_s, out = None, 0.0, {}
    for name, (precision, options) in variants.items():
        use_precision(precision)
        model = Token2WavModel.from_checkpoint(path, device, **options)
        wav, secs = one_shot_wav(model)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if ref is None:
            ref, ref_s = wav, secs
        err = wav - ref
        out[name] = {
            "s": secs, "speedup": ref_s / secs, "rel_l2": float(err.norm() / ref.norm()),
            "snr_db": float(10 * torch.log10(ref.pow(2).sum() / err.pow(2).sum().clamp_min(1e-30))),
            "max_abs": float(err.abs().max()),
        }  # fmt: skip
        say(f"t2w precision {name}: {secs * 1000:.0f} ms, rel. L2 {out[name]['rel_l2']:.2e}, "
            f"SNR {out[name]['snr_db']:.1f} dB")  # fmt: skip
    use_precision("highest")
    return out


def t2w_options(args: argparse.Namespace) -> dict[str, Any]:
    """The token2wav stage's model_options from --token2wav-dtype and --token2wav-compile."""
    return {**T2W_DTYPES[args.token2wav_dtype], **T2W_COMPILE[args.token2wav_compile]}


def first_audio_codes(args: argparse.Namespace) -> int:
    """Codes the talker must write before token2wav can start the first chunk: the first chunk
    and its right context (`diffusion.streaming`, the stage's defaults unless set here)."""
    from omni_mp.engines.diffusion.params import StreamingConfig

    defaults = StreamingConfig()
    return (args.token2wav_first_chunk or defaults.first_chunk) + defaults.right_context


def run_cold(args: argparse.Namespace, stage_id: int) -> dict[str, Any]:
    """One stage alone as its own pipeline (the same stage config, as an entry stage with final
    output): time until it is Ready."""
    from omni_mp.config.validate import parse_config
    from omni_mp.control.embedded import embedded_pipeline

    data = omni_pipeline(args, True)
    stage = next(s for s in data["stages"] if s["id"] == stage_id)
    stage = {k: v for k, v in stage.items() if k not in ("inputs", "processor", "wait_for_upstream")}
    stage.update(final_output=True)
    cfg = parse_config({**data, "stages": [stage]})
    t0 = time.perf_counter()
    with embedded_pipeline(cfg, progress=lambda m: say(m)):
        ready = time.perf_counter() - t0
    say(f"cold{stage_id}: stage {stage_id} alone ready in {ready:.1f}s")
    return {"ready_s": ready, "device": device_name()}


# ---- report -----------------------------------------------------------------------------------
def hf_latency(hf: dict[str, Any], c: int) -> tuple[float | None, float | None]:
    """transformers' first-audio p50 at concurrency c: one at a time (a queue: the median request
    waits for half the others), and batched where measured."""
    one = hf.get("single", {}).get("wall_s")
    serial = one * ((c + 1) // 2 if c > 1 else 1) if one else None
    b = hf.get("batched", {}).get(str(c), {}).get("wall_s")
    return serial, (one if c == 1 else b)


def sizes_line(args: argparse.Namespace) -> str:
    from transformers.utils import logging as hf_logging

    from omni_mp.models.qwen2_5_omni.shapes import omni_shapes_config

    hf_logging.set_verbosity_error()  # transformers' notes on the talker's thinker-vocab ids
    c = omni_shapes_config(qwen2_5_omni_spec(args.smoke, args.talker))
    t, k = c.thinker_config.text_config, c.talker_config
    return (
        f"thinker hidden {t.hidden_size}, {t.num_hidden_layers} layers; talker hidden {k.hidden_size}, "
        f"{k.num_hidden_layers} layers, {k.vocab_size} codec ids; token2wav DiT hidden "
        f"{c.token2wav_config.dit_config.hidden_size}, {c.token2wav_config.dit_config.num_hidden_layers} blocks"
    )


def report(results: dict[str, Any], args: argparse.Namespace, device: str) -> str:
    """The markdown report of every phase in `results`."""
    st = results.get("stream", {})
    lines = [*setup_lines(args, device), *measured_setup_lines(results, args)]
    lines += level_table(results, args)
    lines += scaling_lines(results, args.baseline, args.gpus, args.concurrency)
    playback = playback_line(st, args.concurrency)
    if playback:
        lines.append(playback)
    lines += transport_lines(st.get("transport", {}), max(args.concurrency))
    lines += path_lines(st)
    lines += cold_lines(results, args)
    if "single" in results.get("hf", {}):
        lines.append(
            "\ntransformers: Qwen2_5OmniForConditionalGeneration.generate() built from the same config (bf16 on "
            "GPUs, token2wav fp32), no streaming (first audio = end of generate); 'queued' = one request at a time "
            "(the median request waits for half the others), 'batched' = one generate() over the batch"
        )
    lines += peer_table(args.out, args.concurrency, st)  # vllm-omni's runs in --out, if any (issue 20)
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    lines += [f"\nphase {k} failed: {e}" for k, e in failed.items()]
    return "\n".join(lines)


def setup_lines(args: argparse.Namespace, device: str) -> list[str]:
    """What ran: the device, sizes, lengths and every setting of the stages."""
    layout = {1: "all three stages on GPU 0 (memory budgets)", 2: "thinker on GPU 0, talker + token2wav on GPU 1"}
    return [
        f"{device}; Qwen2.5-Omni {'at 7B shapes scaled down 28x (smoke, CPU)' if args.smoke else 'at 7B shapes'}, "
        f"random weights (vLLM load_format dummy); {'CPU, no budgets' if args.smoke else layout[args.gpus]}; "
        f"{args.prompt_len}-id prompts, {args.thinker_tokens} thinker tokens, "
        f"{args.talker_codes} codes ({args.talker_codes / 50:.2f} s of audio) per request, fixed lengths "
        "(thinker EOS ignored; talker control ids suppressed)",
        f"Sizes: {sizes_line(args)}. "
        + (
            "The talker is the released 7B checkpoint's (hidden 896, 24 layers, 12 heads, 4 KV heads, head_dim 128)."
            if args.talker == "released"
            else "The talker is transformers' default Qwen2_5OmniConfig talker, which is thinker-sized (the "
            "released 7B checkpoint's is much smaller: hidden 896, 24 layers), so it costs about what the thinker does."
        ),
        f"token2wav float32 matmuls: {args.token2wav_matmul} "
        f"({'exact fp32' if args.token2wav_matmul == 'highest' else 'TF32'}); weights: {args.token2wav_dtype}; "
        f"torch.compile: {args.token2wav_compile}; CUDA graphs: {args.token2wav_graphs}; "
        f"MPS client priority: {args.token2wav_priority} (thinker: {args.thinker_priority}, "
        f"talker: {args.talker_priority}); "
        "MPS SM shares (thinker, talker, token2wav): "
        + ", ".join(f"{v}%" if v else "all" for v in args.sm_percent)
        + "; "
        f"thinker and talker weights: {args.ar_quantization if args.ar_quantization != 'none' else 'bf16'}; "
        "streaming chunks (codes): first "
        f"{args.token2wav_first_chunk or 24}, then {args.token2wav_chunk or 48}"
        + (f" doubling up to {args.token2wav_max_chunk}" if args.token2wav_max_chunk else "")
        + f"; chunks of a request in flight: {args.token2wav_chunks_in_flight or 1}"
        + "".join(
            f"; {name} engine args: {json.dumps(extra)}"
            for name, extra in (("thinker", args.thinker_engine_args), ("talker", args.talker_engine_args))
            if extra
        ),
    ]


def measured_setup_lines(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What the phases found of the setup: token2wav's precisions, the budgets, the GPU sharing,
    transformers alone, and how every level was warmed up."""
    hf, st = results.get("hf", {}), results.get("stream", {})
    lines = []
    t2w = results.get("t2w_tf32", {})
    if "rel_l2" in t2w:
        lines.append(
            f"token2wav alone, {t2w['codes']} codes: fp32 {t2w['highest_s']:.3f} s, TF32 {t2w['high_s']:.3f} s "
            f"({t2w['highest_s'] / t2w['high_s']:.2f}x), waveform relative L2 difference {t2w['rel_l2']:.2e}"
        )
    for name, v in t2w.get("engine", {}).items():
        lines.append(
            f"token2wav engine model one-shot, {name}: {v['s'] * 1000:.0f} ms ({v['speedup']:.2f}x fp32), "
            f"waveform vs fp32: relative L2 {v['rel_l2']:.2e}, SNR {v['snr_db']:.1f} dB, max |diff| {v['max_abs']:.2e}"
        )
    budgets = st.get("budgets_gib") or results.get("nostream", {}).get("budgets_gib")
    if budgets:
        lines.append(f"GPU memory budgets, thinker / talker / token2wav: {' / '.join(f'{b:g}' for b in budgets)} GiB")
    if st.get("gpu_sharing"):
        lines.append(f"GPU sharing: {st['gpu_sharing']} (--gpu-sharing {args.gpu_sharing})")
    if "single" in hf:
        s = hf["single"]
        lines.append(
            f"transformers generate(), one request: {s['wall_s']:.2f} s, {s['thinker_tok_s']:.1f} thinker tok/s, "
            f"RTF {s['rtf']:.3f}, {s['audio_s'] / s['wall_s']:.2f} audio s/s"
        )
    for phase in ("hf", "stream", "nostream"):
        line = warmup_line(results.get(phase, {}).get("warmup"), phase)
        if line:
            lines.append(line)
    return lines


def level_table(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """One row per level: omni_mp streaming and not, against transformers."""
    hf, st, ns = results.get("hf", {}), results.get("stream", {}), results.get("nostream", {})
    lines = [
        "",
        "| concurrency | first audio p50 / p90 (stream) | no stream p50 | transformers p50 (queued / batched) "
        "| RTF (stream) | audio s/s (stream) | vs transformers | thinker tok/s | vs transformers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    single = hf.get("single", {})

    def ratio(x: float | None, base: float) -> str:
        return f"{x / base:.1f}x" if x and base else "-"

    for c in args.concurrency:
        a, b = st.get(str(c), {}), ns.get(str(c), {})
        serial, batched = hf_latency(hf, c)
        hf_b = hf.get("batched", {}).get(str(c), {})
        # transformers' best throughput at c: batched where measured, else one at a time
        hf_rates = [single["audio_s"] / single["wall_s"]] if single else []
        hf_rates += [hf_b["audio_s"] / hf_b["wall_s"]] if "wall_s" in hf_b else []
        hf_audio = max(hf_rates, default=0.0)
        hf_tok = max(single.get("thinker_tok_s", 0), hf_b.get("thinker_tok_s", 0))
        p = f"{ms(a.get('first_audio_p50_s'))} / {ms(a.get('first_audio_p90_s'))}" if a else "-"
        lines.append(
            f"| {c} | {p} | {ms(b.get('first_audio_p50_s'))} | {ms(serial)} / {ms(batched)} "
            f"| {a.get('rtf_mean', float('nan')):.3f} | {a.get('audio_s_per_s', float('nan')):.2f} "
            f"| {ratio(a.get('audio_s_per_s'), hf_audio)} | {a.get('thinker_tok_s', float('nan')):.0f} "
            f"| {ratio(a.get('thinker_tok_s'), hf_tok)} |"
        )
    return lines


def transport_lines(tr: dict[str, Any], top: int) -> list[str]:
    """The thinker -> talker transport per engine step (`transport_summary`) at level `top`."""
    lines = [f"\nthinker -> talker transport per engine step (streaming, c={top}, last round):"]
    nan = float("nan")
    if "thinker" in tr:
        t = tr["thinker"]
        lines.append(
            f"- thinker send side ({t['steps']} steps, {t['reqs_per_step_mean']:.1f} requests and "
            f"{t['rows_per_step_mean']:.1f} hidden rows per step): build + send p50 {t['build_send_us_p50']:.0f} us "
            f"(build {t['build_us_p50']:.0f} us, encode + send {t['send_us_p50']:.0f} us; target <= 300 us), "
            f"of CPU {t.get('build_send_cpu_us_p50', nan):.0f} us (build {t.get('build_cpu_us_p50', nan):.0f}, "
            f"encode + send {t.get('send_cpu_us_p50', nan):.0f}), "
            f"{t['wire_bytes_p50'] / 1024:.1f} KiB on the wire p50; thinker step p50 {t['step_ms_p50']:.2f} ms"
        )
    else:
        lines.append(f"- thinker send side: not measured ({tr.get('error', 'no streaming phase')})")
    if "talker" in tr:
        t = tr["talker"]
        lines.append(
            f"- talker receive side ({t['steps']} steps, {t['rows_per_step_mean']:.1f} step rows taken per step): "
            f"receive + handle p50 {t['recv_handle_us_p50']:.0f} us (receive + decode {t['recv_us_p50']:.0f} us on "
            f"the input thread, handling {t['handle_us_p50']:.0f} us on the engine thread); "
            f"talker step p50 {t['step_ms_p50']:.2f} ms"
        )
    else:
        lines.append(f"- talker receive side: not measured ({tr.get('talker_error', 'no streaming phase')})")
    return lines


def path_lines(st: dict[str, Any]) -> list[str]:
    """One request's path, every burst's, and each stage's steps per level (stream phase)."""
    lines = []
    if st.get("critical_path_c1"):
        lines.append(critical_path_line(st["critical_path_c1"]))
    if st.get("burst_paths"):
        lines.append("\nall requests of a level at once (the last round; ms from its start):")
        lines += [burst_path_line(c, bp) for c, bp in st["burst_paths"].items()]
    if st.get("stage_steps"):
        lines += stage_steps_table(
            "\nengine steps per stage (streaming, last round of each level): steps, step p50 / mean ms, busy",
            st["stage_steps"],
            ("thinker", "talker", "token2wav"),
        )
    return lines


def cold_lines(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Cold start to Ready: the pipeline's against each stage alone, and the compile cache."""
    st = results.get("stream", {})
    if "cold_start_s" not in st:
        return []
    colds = {k: v["ready_s"] for k, v in results.items() if k.startswith("cold") and "ready_s" in v}
    alone = ", ".join(f"stage {k[4:]} {v:.1f} s" for k, v in sorted(colds.items())) or "not measured"
    slowest = max(colds.values()) if colds else None
    extra = f" ({st['cold_start_s'] / slowest:.2f}x the slowest stage)" if slowest else ""
    lines = [
        f"\ncold start to Ready: whole pipeline {st['cold_start_s']:.1f} s{extra} (stages start in parallel); "
        f"each stage alone: {alone}"
    ]
    caches = {r.get("compile_cache") for k, r in results.items() if k != "hf" and isinstance(r, dict)} - {None}
    if caches == {"per-phase"} and not args.smoke:
        lines.append("(every phase started with an empty vLLM compile cache: all of these are first starts)")
    elif caches:
        lines.append(f"(vLLM compile cache: {', '.join(sorted(caches))}; shared = warm after the first start)")
    return lines


def plot(results: dict[str, Any], args: argparse.Namespace, path: Path, device: str) -> bool:
    plt = pyplot()
    if plt is None:
        say(f"matplotlib is missing on this host: no {path.name} (the JSON and markdown are written)")
        return False
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    cs = args.concurrency
    for phase, label in (("stream", "omni_mp, streaming"), ("nostream", "omni_mp, no streaming")):
        xs = [c for c in cs if str(c) in results.get(phase, {})]
        if xs:
            ax.plot(xs, [results[phase][str(c)]["first_audio_p50_s"] for c in xs], marker="o", label=label)
            ax2.plot(xs, [results[phase][str(c)]["audio_s_per_s"] for c in xs], marker="o", label=label)
    for config, peer in peer_docs(args.out).items():  # vllm-omni's runs in --out, if any (issue 20)
        xs = [c for c in cs if str(c) in peer]
        if xs:
            label = f"vllm-omni, {config}"
            ax.plot(xs, [peer[str(c)]["first_audio_p50_s"] for c in xs], marker="^", ls="-.", label=label)
            ax2.plot(xs, [peer[str(c)]["audio_s_per_s"] for c in xs], marker="^", ls="-.", label=label)
    hf = results.get("hf", {})
    if "single" in hf:
        ax.plot(cs, [hf_latency(hf, c)[0] for c in cs], marker="s", ls="--", label="transformers, one at a time")
        ax2.axhline(hf["single"]["audio_s"] / hf["single"]["wall_s"], ls="--", color="gray", label="transformers")
        bx = [c for c in cs if "wall_s" in hf.get("batched", {}).get(str(c), {})]
        if bx:
            ax.plot(
                bx, [hf["batched"][str(c)]["wall_s"] for c in bx], marker="s", ls=":", label="transformers, batched"
            )
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent requests")
        a.legend(fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("time to first audio, p50 (s)")
    ax2.set_ylabel("audio seconds per second")
    fig.suptitle(f"Qwen2.5-Omni {'(smoke)' if args.smoke else '7B shapes'}, {device}, --gpus {args.gpus}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    say(f"wrote {path}")
    return True


# ---- orchestration ----------------------------------------------------------------------------
def run_phase(args: argparse.Namespace) -> dict[str, Any]:
    if args.phase == "hf":
        return run_hf(args)
    if args.phase in ("stream", "nostream"):
        return run_pipeline(args, args.phase == "stream")
    if args.phase == "t2w_tf32":
        return run_t2w_precision(args)
    return run_cold(args, int(args.phase[4:]))


def run_phase_in_process(args: argparse.Namespace, phase: str, deadline: float | None) -> dict[str, Any]:
    """`phase` in a fresh process, within --phase-timeout-s and what is left of --deadline-s."""
    env = dict(os.environ)
    if args.compile_cache == "per-phase" and not args.smoke:
        # vLLM's torch.compile / inductor / triton caches live under VLLM_CACHE_ROOT: an empty one
        # per phase makes every engine start a first start, so the pipeline's cold start and each
        # stage's alone are measured alike, whatever ran before on this host.
        env["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix=f"omni_gpu-vllm-cache-{phase}-")
    return run_phase_process(
        "benchmarks.omni_gpu", phase, args.out, timeout_s=args.phase_timeout_s, say=say, deadline=deadline,
        margin_s=RENDER_MARGIN_S, env=env, fresh=True,
        extra={"compile_cache": "shared" if args.smoke else args.compile_cache},
    )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--gpus", type=int, default=2, choices=[1, 2])
    p.add_argument(
        "--layout", choices=LAYOUTS, default="split", help="stage replicas (benchmarks/common/replica_layouts.py)"
    )
    p.add_argument("--baseline", type=Path, help="a one-GPU run's --out: report the scaling efficiency against it")
    add_gpu_sharing_arg(p)
    p.add_argument("--concurrency", type=int_list, default=[1, 8, 32, 64])
    p.add_argument("--thinker-tokens", type=int, default=128)
    p.add_argument("--talker-codes", type=int, default=200, help="codes per request (50 = 1 s of audio)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument(
        "--talker",
        choices=["released", "default"],
        default="released",
        help="released: the 7B checkpoint's talker sizes; default: transformers' default (thinker-sized) talker",
    )
    add_token2wav_args(p)
    add_stage_args(p)
    p.add_argument("--rounds", type=int, default=1, help="measured rounds per level (after its warm-up); best kept")
    p.add_argument("--hf-max-batch", type=int, default=8, help="largest transformers batch tried")
    p.add_argument("--budgets-gib", help="thinker,talker,token2wav GPU budgets (default: SHARES of the device)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: a check that every phase runs")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "omni_gpu-models")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "omni_gpu")
    p.add_argument("--phase-timeout-s", type=float, default=1500)
    p.add_argument("--deadline-s", type=float, help="the whole invocation's limit: phases that cannot start skip")
    p.add_argument(
        "--compile-cache",
        choices=["per-phase", "shared"],
        default="per-phase",
        help="per-phase: an empty vLLM compile cache for every phase (all starts are cold, comparable); "
        "shared: the host's (starts after the first are warm)",
    )
    p.add_argument(
        "--torch-profile",
        type=profile_windows,
        help="STAGE:FIRST_STEP:STEPS[,...]: a PyTorch profile of those engine steps of a stage (counted from its "
        "start: per level in order, its warm-up round, then its measured rounds; the timelines give each round's "
        "step counts), "
        "written to <out>/profile-<phase>/torch-stage<STAGE>-<FIRST_STEP>.txt and .trace.json.gz",
    )
    args = p.parse_args(argv)
    if args.smoke:
        given = argv or sys.argv
        args.gpus = 1
        for flag, small in (("--concurrency", [1, 2]), ("--thinker-tokens", 8), ("--talker-codes", 36),
                            ("--prompt-len", 16)):  # fmt: skip
            if flag not in given:
                setattr(args, flag[2:].replace("-", "_"), small)
        args.hf_max_batch = min(args.hf_max_batch, 2)
    return args


def add_token2wav_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--token2wav-matmul",
        choices=["highest", "high"],
        default="highest",
        help="token2wav's float32 matmuls: exact (highest, as transformers) or TF32 (high)",
    )
    p.add_argument(
        "--token2wav-dtype",
        choices=list(T2W_DTYPES),
        default="float32",
        help="token2wav's weights: float32 (as transformers), bfloat16-dit (the DiT under bf16 autocast), "
        "bfloat16 (DiT and vocoder); bf16 changes the waveform (phase t2w_tf32 measures by how much)",
    )
    p.add_argument(
        "--token2wav-compile",
        choices=list(T2W_COMPILE),
        default="all",
        help="torch.compile token2wav's DiT block (dit) or that and BigVGAN's activations (all, a CUDA "
        "stage's default); off: eager. Phase t2w_tf32 measures the waveform against eager exact fp32",
    )
    p.add_argument("--token2wav-first-chunk", type=int, help="codes of the first audio chunk (stage default: 24)")
    p.add_argument("--token2wav-chunk", type=int, help="codes of each later audio chunk (stage default: 48)")
    p.add_argument(
        "--token2wav-max-chunk",
        type=int,
        help="growing chunks: after the first, sizes double from --token2wav-chunk up to this (stage default: 0, off)",
    )
    p.add_argument(
        "--token2wav-chunks-in-flight",
        type=int,
        help="chunks of one request solved at once (streaming max_chunks_in_flight; stage default 1): 2 lets a "
        "request's last chunk start while the one before it is still being solved",
    )
    p.add_argument(
        "--token2wav-graphs",
        choices=["on", "off"],
        default="on",
        help="token2wav's DiT and BigVGAN as CUDA graphs per batch/length bucket (on a GPU), or eager",
    )


def add_stage_args(p: argparse.ArgumentParser) -> None:
    """MPS priorities and SM shares, quantization and vLLM engine args of the AR stages."""
    p.add_argument(
        "--token2wav-priority",
        choices=["normal", "below_normal"],
        default="normal",
        help="token2wav's MPS client priority (stage mps_priority): below_normal lets the thinker's and talker's "
        "kernels go first on the shared GPU; time-sliced it changes nothing (--smoke: CPU stages, no priority)",
    )
    p.add_argument(
        "--thinker-priority",
        choices=["normal", "below_normal"],
        default="normal",
        help="the thinker's MPS client priority; with --talker-priority below_normal too, token2wav's kernels go "
        "first (its chunks are short bursts on the first audio's path)",
    )
    p.add_argument(
        "--talker-priority",
        choices=["normal", "below_normal"],
        default="normal",
        help="the talker's MPS client priority; with --token2wav-priority below_normal too, the thinker's kernels "
        "go first (the talker waits for its rows anyway while the thinker writes)",
    )
    p.add_argument(
        "--sm-percent",
        type=sm_percents,
        default=[None, None, None],
        help="thinker,talker,token2wav: each stage's share of the SMs under MPS (stage mps_sm_percent), an empty "
        "field for all of them; e.g. 60,, caps the thinker so token2wav's and the talker's kernels find free SMs",
    )
    p.add_argument(
        "--ar-quantization",
        choices=["none", "fp8"],
        default="none",
        help="fp8: vLLM's online FP8 quantization of the thinker's and talker's weights (half the bytes a decode "
        "step reads; tokens and codes change, so an opt-in like the bf16 DiT)",
    )
    for stage in ("thinker", "talker"):
        p.add_argument(
            f"--{stage}-engine-args",
            type=json.loads,
            default={},
            help=f"a JSON object of vLLM engine args for the {stage}, over the benchmark's own, e.g. "
            '\'{"attention_backend": "TRITON_ATTN"}\' (an A/B of a vLLM setting)',
        )


def main() -> int:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # No vLLM plugin in omni_mp's engines (vLLM reads VLLM_PLUGINS as a comma list of names to
    # load; "" names none): vllm-omni's, should it be importable here, patches vLLM classes.
    os.environ["VLLM_PLUGINS"] = ""
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase:  # a child: run one phase, write its result (or its error, for the report)
        return run_child_phase(args.out / f"{args.phase}.json", lambda: run_phase(args))
    phases = split_phases(args.phases, PHASES)  # none: only re-render the report
    if phases:
        missing = preflight(args)
        if missing:
            say("PREFLIGHT FAILED, this host lacks:")
            for m in missing:
                say(f"  - {m}")
            say(
                "(the GPU image has torch, torchvision, transformers, matplotlib; vLLM 0.25.0, pyzmq, msgspec "
                "come from the GPU host recipe's wheel carry (scripts/gpu/), then PYTHONPATH=/tmp/site:$PWD)"
            )
            return 2
        t0 = time.perf_counter()
        path = model_dir(args)  # once, before any phase (the phases reuse the cached dir)
        say(f"model dir {path} ready in {time.perf_counter() - t0:.1f}s")
    t_all = time.perf_counter()
    deadline = T_START + args.deadline_s if args.deadline_s else None
    for phase in phases:
        run_phase_in_process(args, phase, deadline)
    if phases:
        say(f"phases {','.join(phases)} took {time.perf_counter() - t_all:.0f}s")
    results = phase_results(args.out, PHASES)
    device = devices_of(results)
    text = report(results, args, device)
    doc = {"device": device, "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    (args.out / "omni_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    if not plot(results, args, args.out / "omni_gpu.png", device):
        text += "\n\n(no omni_gpu.png: matplotlib is missing on the host that rendered this report)"
    (args.out / "omni_gpu.md").write_text(text + "\n")
    print("\n" + text, flush=True)
    say(f"wrote {args.out / 'omni_gpu.json'} and {args.out / 'omni_gpu.md'}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Qwen3-Omni-30B-A3B at the released sizes (random weights): omni_mp's thinker -> talker (with its
code predictor) -> streaming code2wav on one H200, against the published numbers (issue 22).

The pipeline is omni_mp/stage_configs/qwen3_omni.yaml's, on a checkpoint dir written by
benchmarks.common.checkpoints:
  config.json   `released_config()` (omni_mp.models.qwen3_omni.tiny): every size of the released
                Qwen3-Omni-30B-A3B-Instruct written explicitly (thinker 48 layers x 128 experts,
                hidden 2048; talker 20 layers x 128 experts, hidden 1024; code predictor 5 layers;
                code2wav 8 layers + decoder), never transformers' defaults;
  code2wav.*    random fp32 tensors (safetensors): the code2wav stage loads real tensors;
  no thinker or talker weights: vLLM builds them with `load_format: dummy` (random), and the
  thinker starts with `skip_tokenizer_init` and every media limit 0 (no towers are built;
  prompts go in as token ids).
  stage 0 thinker   vLLM's Qwen3-Omni thinker (model_part qwen3_omni_thinker), streaming layer
                    `accept_hidden_layer` (24) rows to the talker;
  stage 1 talker    our vLLM talker (model_part qwen3_omni_talker, processor qwen3_omni_talker),
                    its 15-step code predictor inside each step;
  stage 2 code2wav  the streaming window decoder (diffusion model_type qwen3_omni_code2wav,
                    processor qwen3_omni_code2wav).
Fixed lengths: every request has a distinct random user turn of --prompt-len ids in the chat
format (the talker reads the user and assistant turns), the thinker writes exactly
--thinker-tokens tokens (`ignore_eos`), the talker exactly --talker-frames frames (every codec
control id suppressed, so it never stops early and code2wav gets only codes; 12.5 frames = 1 s).

Per concurrency level (--concurrency, default 1 8 32 64), in order: one unmeasured warm-up
round at that level (its batch shapes' first runs: benchmarks.common.warmup), then one measured
round: first audio p50/p90 (submit to the first audio chunk at the client), RTF (per
request: submit to its last audio over the audio's length, mean), audio seconds per second,
thinker tokens/s; and the per-stage timeline (OMNI_MP_PROFILE_DIR: each stage's engine steps,
step time and how busy it was in the level's last round; the thinker -> talker transport per
step). With --closed-loop X, after the rounds, per level c > 1: X x c requests with c in flight,
each finished one replaced (vLLM bench serve's --max-concurrency, the published figures' method).
Phases, each in a fresh process: `stream`, and `nostream` (`wait_for_upstream: true` on
talker and code2wav: what streaming gains). Outputs in --out: qwen3_omni_gpu.json, .md, .png.

One H200 (kind nvidia-h200), all three stages on GPU 0 with memory budgets 0.70 / 0.14 / 0.10
of it (thinker ~57 GiB of bf16 weights without towers + KV; talker + code predictor ~6.2 GiB
+ KV; code2wav 0.8 GiB fp32 + its batch's activations), thinker and talker keeping
--ar-reserve-gib beside their KV caches; omni_mp/stage_configs/qwen3_omni.yaml's step budget (8192) and
code2wav priority (below normal) by default, both flags to compare:
  ENV = export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 \
        VLLM_WORKER_MULTIPROC_METHOD=spawn HF_HUB_OFFLINE=1
  $ENV && python3 -m benchmarks.qwen3_omni_gpu --phases stream --deadline-s 570 --out $OUT/qwen3_omni_gpu
Two GPUs (kind nvidia-h200-x2; omni_mp/stage_configs/qwen3_omni.yaml's two-GPU layout): the thinker on GPU
0 with 0.86 of it, talker + code2wav on GPU 1 with 0.72 / 0.17 of it: the same command with
`--gpus 2`. Either way ENV needs omni_mp's own wheels beside vLLM's in /tmp/site (the GPU host
recipe, scripts/gpu/: soundfile, soxr).
vllm-omni's Qwen3-Omni pipeline on the same GPU, model dir, prompts and lengths:
benchmarks.peer_vllm_omni --family qwen3_omni (its docstring has the command); the report
and plot show its result files (vllm_omni_qwen3_omni_*.json) from --out next to omni_mp's.
Locally, to re-render from fetched phase files: python -m benchmarks.qwen3_omni_gpu --phases '' --out DIR
CPU smoke of the whole path on the tiny checkpoint (the same stage configs, fp32, eager):
  PYTHONPATH=$PWD python -m benchmarks.qwen3_omni_gpu --smoke --out /tmp/q3_smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.checkpoints import qwen3_omni_dir
from benchmarks.common.peer_report import peer_docs, peer_table
from benchmarks.common.phases import (
    REPO,
    add_gpu_sharing_arg,
    device_name,
    devices_of,
    phase_results,
    run_child_phase,
    run_phase_process,
    split_phases,
)
from benchmarks.common.replica_layouts import LAYOUTS, apply_layout, scaling_lines
from benchmarks.common.report import make_say, ms, pyplot
from benchmarks.common.rounds import chat_prompts, check_round, closed_loop_round, measure_levels, playback_line
from benchmarks.common.timelines import read_timelines, stage_step_summary, stage_steps_table, transport_summary
from benchmarks.common.warmup import warmup_line

PHASES = ["stream", "nostream"]
T_START = time.perf_counter()
RENDER_MARGIN_S = 15
# Memory budgets of thinker / talker / code2wav as fractions of a device, per layout (--gpus):
# 1: all on GPU 0; 2: the thinker on GPU 0, talker + code2wav on GPU 1 (omni_mp/stage_configs/qwen3_omni.yaml's
# two-GPU comments: 120 / 100 / 24 GiB of an H200).
SHARES = {1: (0.70, 0.14, 0.10), 2: (0.86, 0.72, 0.17)}
DEVICES = {1: ([0], [0], [0]), 2: ([0], [1], [1])}
LAYOUT = {1: "all three stages on GPU 0", 2: "thinker on GPU 0, talker + code2wav on GPU 1"}
# Prefill and mixed steps (a prompt chunk, with or without decodes) replayed from vLLM's
# piecewise CUDA graphs up to the step budget (vLLM's default list stops at 2 x max_num_seqs),
# as omni_mp/stage_configs/qwen3_omni.yaml captures them: on an H200, a step outside the graphs costs
# ~48 ms whatever its size (1024 tokens as 2048), one inside them what its tokens cost.
PREFILL_GRAPH_SIZES = (32, 64, 128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1792, 2048, 3072, 4096, 6144, 8192)
# Thinker's and talker's tokens per step (--prefill-budget), as omni_mp/stage_configs/qwen3_omni.yaml: a
# burst of 2500-token prompts prefills in fewer, fuller steps (one H200, 32 requests: RTF 0.317
# at 2048 -> 0.292 at 8192, with code2wav below normal priority; docs/benchmarks/journal.md). vLLM's
# online default is 2048. Their budgets then keep AR_RESERVE_GIB beside the KV cache.
MAX_BATCHED_TOKENS = 8192
AR_RESERVE_GIB = 9.0
FRAMES_PER_S = 12.5
STAGE_NAMES = ("thinker", "talker", "code2wav")
# Published numbers (issue 22): vllm-omni nightly, 3 H100s, 2500 tokens in, 900 out.
PUBLISHED = {
    "vllm-omni, 3x H100 (first audio mean, RTF)": {8: (0.325, 0.169), 16: (0.603, 0.209), 32: (1.024, 0.279)},
    "vllm-omni, 2x H100 (RTF)": {1: (None, 0.118), 8: (None, 0.200), 32: (None, 0.420)},
}
QWEN_REPORT_FIRST_PACKET_S = 0.234  # Qwen's report, one request
say = make_say("qwen3_omni_gpu")


def capture_sizes(max_num_seqs: int, prefill: bool, budget: int) -> list[int]:
    """CUDA graph sizes of an AR stage: vLLM's default decode sizes (1, 2, 4, then every 8 up to
    2 x max_num_seqs), and with `prefill` the sizes of PREFILL_GRAPH_SIZES above them up to the
    step budget `budget`."""
    decode = [1, 2, 4, *range(8, 2 * max_num_seqs + 1, 8)]
    return decode + [n for n in PREFILL_GRAPH_SIZES if prefill and decode[-1] < n <= budget]


def pipeline(args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """omni_mp/stage_configs/qwen3_omni.yaml's three stages at the benchmark's lengths."""
    model = str(model_dir(args))
    config = json.loads((Path(model) / "config.json").read_text())
    conc = max(args.concurrency)
    if args.smoke:
        devs: list[list[int]] = [[], [], []]
        common: dict[str, Any] = {"dtype": "float32", "enforce_eager": True}
    else:
        devs = [list(d) for d in DEVICES[args.gpus]]
        common = {
            "dtype": "bfloat16",
            "max_num_batched_tokens": args.prefill_budget,
            "compilation_config": {
                "cudagraph_capture_sizes": capture_sizes(conc, args.prefill_graphs == "on", args.prefill_budget)
            },
        }
    common.update({"seed": 0, "max_num_seqs": conc, "load_format": "dummy"})
    layer = int(config["talker_config"]["accept_hidden_layer"])
    talker_vocab = int(config["talker_config"]["text_config"]["vocab_size"])
    codebook = int(config["talker_config"]["code_predictor_config"]["vocab_size"])
    thinker = {
        "id": 0, "model": model, "model_part": "qwen3_omni_thinker", "devices": devs[0],
        "hidden_states": {"layers": [layer]},
        "engine_args": {
            **common, "skip_tokenizer_init": True, "limit_mm_per_prompt": {"audio": 0, "image": 0, "video": 0},
            "max_model_len": args.prompt_len + args.thinker_tokens + 64,
        },
        "sampling": {"temperature": 0.0, "ignore_eos": True, "max_tokens": args.thinker_tokens},
    }  # fmt: skip
    talker = {
        "id": 1, "model": model, "model_part": "qwen3_omni_talker", "devices": devs[1], "inputs": [0],
        "processor": "qwen3_omni_talker", "hidden_states": {},
        "engine_args": {**common, "max_model_len": args.prompt_len + args.talker_frames + 64},
        "sampling": {
            # its last sampled code is never fed back, so it has no frame: one more step
            "temperature": 0.0, "ignore_eos": True, "max_tokens": args.talker_frames + 1,
            # every codec control id (codec eos included): exactly --talker-frames frames of codes
            "suppress_token_ids": list(range(codebook, talker_vocab)),
        },
    }  # fmt: skip
    code2wav = {
        "id": 2, "model": model, "kind": "diffusion", "devices": devs[2], "inputs": [1],
        "processor": "qwen3_omni_code2wav", "final_output": True, "engine_args": {"max_model_len": 4096},
        "diffusion": {
            "model_type": "qwen3_omni_code2wav", "max_batch": min(conc, args.code2wav_max_batch),
            "float32_matmul": args.code2wav_matmul, "cuda_graphs": args.code2wav_graphs == "on",
            "streaming": {
                "first_chunk": 16, "chunk": 16 * args.code2wav_chunk, "max_chunk": 16 * args.code2wav_max_chunk,
                "left_context": 0, "right_context": 16, "crossfade_ms": 0.0,
            },
        },
    }  # fmt: skip
    stages = [thinker, talker, code2wav]
    if not stream:
        talker["wait_for_upstream"] = code2wav["wait_for_upstream"] = True
    if args.smoke:
        apply_layout(stages, args.layout, None, None)
    else:
        from omni_mp.control.memory_budget import GiB, query_devices

        devices = query_devices()
        if not devices or any(d not in devices for d in range(args.gpus)):
            raise SystemExit(f"--gpus {args.gpus} needs GPUs 0..{args.gpus - 1} to size the memory budgets")
        total = devices[0].total_bytes / GiB
        for s, share in zip(stages, SHARES[args.gpus], strict=True):
            s["memory"] = {"gpu_gib": round(devices[s["devices"][0]].total_bytes * share / GiB, 1)}
        if args.layout != "split":
            if args.gpus != 2:
                raise SystemExit(f"--layout {args.layout} needs --gpus 2")
            apply_layout(stages, args.layout, [total * x for x in SHARES[1]], [total * x for x in SHARES[2]])
        for s in (thinker, talker):
            s["memory"]["reserve_gib"] = args.ar_reserve_gib
        code2wav["mps_priority"] = args.code2wav_priority
    return {
        "name": "qwen3_omni_bench",
        "timeouts": {"stage_startup_s": 900},
        "gpu_sharing": {"mode": args.gpu_sharing},
        "stages": stages,
    }


def replica_label(key: Any) -> str:
    """A stage process in the results: its stage id, `.replica` for replicas past the first."""
    return str(key.stage_id) if key.replica == 0 else f"{key.stage_id}.{key.replica}"


def stage_memory_now(coord: Any) -> dict[str, str]:
    """What each GPU stage's process holds now, by the driver's count (PyTorch keeps what it
    once allocated cached, so after the rounds this is about each stage's peak)."""
    from omni_mp.utils.gpu_memory import GiB, process_gpu_bytes

    out = {}
    for key, h in coord.stages.items():
        if h.run is None or not h.stage.devices:
            continue
        used = process_gpu_bytes(h.pid, h.stage.devices)
        if used is not None:
            out[replica_label(key)] = "; ".join(f"GPU {d}: {n / GiB:.2f} GiB" for d, n in sorted(used.items()))
    return out


def model_dir(args: argparse.Namespace) -> Path:
    """The checkpoint dir: released shapes (config + code2wav tensors), or for --smoke a view of
    the tiny checkpoint (same layout, real small weights)."""
    return qwen3_omni_dir(args.work_dir, args.smoke)


def run_pipeline(args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """One phase: the cold start, each level warmed up and then measured (`measure_levels`),
    the closed loops (--closed-loop), and what the stage timelines say of the measured rounds."""
    from omni_mp.config.validate import parse_config
    from omni_mp.control.embedded import embedded_pipeline
    from omni_mp.stage.timeline import PROFILE_DIR_ENV

    name = "stream" if stream else "nostream"
    cfg = parse_config(pipeline(args, stream))
    config = json.loads((Path(model_dir(args)) / "config.json").read_text())
    profile_dir = Path(tempfile.mkdtemp(prefix="qwen3_omni_gpu-profile-"))
    os.environ[PROFILE_DIR_ENV] = str(profile_dir)  # inherited by the stage processes
    out = pipeline_facts(args, cfg, config)
    t0 = time.perf_counter()
    with embedded_pipeline(cfg, progress=say) as coord:
        out["cold_start_s"] = time.perf_counter() - t0
        out["gpu_sharing"] = coord.sharing_note
        # what each stage holds once started, against its budget (omni_mp.stage.memory_check)
        out["stage_memory"] = {
            replica_label(key): h.run.info.get("gpu_memory") for key, h in coord.stages.items() if h.run is not None
        }
        say(f"{name}: pipeline ready in {out['cold_start_s']:.1f}s")
        levels, windows, warmups = measure_levels(
            coord.client_endpoint,
            args.concurrency,
            1,
            lambda c, seed: chat_prompts(config, c, args.prompt_len, seed),
            None,
            say,
            name,
        )
        out.update(levels)
        out["warmup"] = warmups.to_json()
        if args.closed_loop:  # each level above 1 was warmed up by its burst rounds
            out["closed"], closed_windows = closed_loops(args, coord.client_endpoint, config)
        out["stage_memory_after"] = stage_memory_now(coord)
    # from the first measured round on (the closed loops ran after the rounds)
    timelines = read_timelines(profile_dir, min((t0 for t0, _ in windows.values()), default=0.0))
    out["transport"] = transport_summary(timelines, max(windows.values(), default=(0.0, 0.0))[0])
    out["stage_steps"] = stage_step_summary(timelines, windows)
    if args.closed_loop:
        out["closed_stage_steps"] = stage_step_summary(timelines, closed_windows)
    shutil.copytree(profile_dir, args.out / f"profile-{name}", dirs_exist_ok=True)
    shutil.rmtree(profile_dir, ignore_errors=True)  # copied to --out
    return out


def pipeline_facts(args: argparse.Namespace, cfg: Any, config: dict[str, Any]) -> dict[str, Any]:
    """What the report names of the pipeline before it starts: device(s), the talker's layer,
    memory budgets, CUDA graph sizes."""
    out: dict[str, Any] = {"pipeline": cfg.name, "device": device_name(), "gpus": args.gpus}
    if args.gpus > 1 and not args.smoke:
        out["device"] = f"{args.gpus}x {out['device']}"
    out["layer"] = int(config["talker_config"]["accept_hidden_layer"])
    out["budgets_gib"] = [s.memory.gpu_gib for s in cfg.stages if s.memory is not None]
    out["graph_sizes"] = cfg.stages[0].engine_args.get("compilation_config", {}).get("cudagraph_capture_sizes")
    return out


def closed_loops(
    args: argparse.Namespace, endpoint: str, config: dict[str, Any]
) -> tuple[dict[str, Any], dict[int, tuple[float, float]]]:
    """Per level above 1: --closed-loop x c requests with c in flight (rounds.closed_loop: the
    published vllm-omni figures' method), each request's lengths checked. Levels of 1 are
    skipped: one request at a time is what the burst round of 1 measures already."""

    def check(batch: list[list[int]], reqs: list[dict[str, Any]]) -> None:
        # every request as long as the first, which is --talker-frames frames less the decoder's
        # fixed look-ahead tail (under one frame)
        audio_s = reqs[0]["audio_s"]
        if not 0 <= args.talker_frames / FRAMES_PER_S - audio_s < 1 / FRAMES_PER_S:
            raise RuntimeError(f"{audio_s:.4f} s of audio for {args.talker_frames} frames")
        check_round(batch, reqs, args.thinker_tokens, audio_s)

    out: dict[str, Any] = {}
    windows: dict[int, tuple[float, float]] = {}
    for c in (c for c in args.concurrency if c > 1):
        n = args.closed_loop * c
        batch = chat_prompts(config, n, args.prompt_len, 5000 * c)
        t0 = time.time()
        res = asyncio.run(closed_loop_round(endpoint, batch, c, check))
        windows[c] = (t0, time.time())
        out[str(c)] = res
        say(
            f"closed loop c={c}, {n} requests: first audio mean {res['first_audio_mean_s'] * 1000:.0f} ms, "
            f"p50 {res['first_audio_p50_s'] * 1000:.0f} ms, p90 {res['first_audio_p90_s'] * 1000:.0f} ms, "
            f"RTF {res['rtf_mean']:.3f}, {res['audio_s_per_s']:.2f} audio s/s"
        )
    return out, windows


def report(results: dict[str, Any], args: argparse.Namespace, device: str) -> str:
    """The markdown report of the phases in `results`."""
    st, ns = results.get("stream", {}), results.get("nostream", {})
    audio_s = args.talker_frames / FRAMES_PER_S
    lines = [
        f"{device}; Qwen3-Omni-30B-A3B {'tiny checkpoint (smoke, CPU)' if args.smoke else 'at the released sizes'}, "
        f"random weights (vLLM load_format dummy); {'CPU' if args.smoke else LAYOUT[st.get('gpus', args.gpus)]}; "
        f"{args.prompt_len}-id prompts, {args.thinker_tokens} thinker tokens, {args.talker_frames} talker frames "
        f"({audio_s:.1f} s of audio) per request, fixed lengths (thinker EOS ignored; codec control ids suppressed)",
    ]
    if st.get("budgets_gib"):
        lines.append(f"GPU memory budgets, thinker / talker / code2wav: {' / '.join(map(str, st['budgets_gib']))} GiB")
    lines += [line for phase in PHASES if (line := warmup_line(results.get(phase, {}).get("warmup"), phase))]
    lines += [
        "",
        "| concurrency | first audio p50 / p90 (stream) | no stream p50 | RTF (stream) | audio s/s | thinker tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for c in args.concurrency:
        a, b = st.get(str(c), {}), ns.get(str(c), {})
        p = f"{ms(a.get('first_audio_p50_s'))} / {ms(a.get('first_audio_p90_s'))}" if a else "-"
        lines.append(
            f"| {c} | {p} | {ms(b.get('first_audio_p50_s'))} | {a.get('rtf_mean', float('nan')):.3f} "
            f"| {a.get('audio_s_per_s', float('nan')):.2f} | {a.get('thinker_tok_s', float('nan')):.0f} |"
        )
    if args.layout != "split":
        lines.append(f"\nstage replicas: --layout {args.layout} (benchmarks/common/replica_layouts.py)")
    lines += scaling_lines(results, args.baseline, st.get("gpus", args.gpus), args.concurrency)
    playback = playback_line(st, args.concurrency)
    if playback:
        lines.append(playback)
    lines.append(
        "\nPublished (issue 22; other hardware and lengths: 2500 tokens in, 900 out): "
        f"Qwen's report {QWEN_REPORT_FIRST_PACKET_S * 1000:.0f} ms first packet at 1 request; "
        + "; ".join(f"{name}: " + ", ".join(_published(d)) for name, d in PUBLISHED.items())
        + ". Targets on one H200: first audio <= 250 ms at 1 and <= 2x that at 32; RTF <= 0.15 at 1, <= 0.30 at 32."
    )
    lines += closed_loop_lines(st)
    lines += target_lines(st)
    lines += stage_lines(st, args)
    lines += peer_table(args.out, args.concurrency, st, "qwen3_omni")  # vllm-omni's Qwen3-Omni runs in --out
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    lines += [f"\nphase {k} failed: {e}" for k, e in failed.items()]
    return "\n".join(lines)


def stage_lines(st: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The stages in the stream phase: transport, steps per level, cold start, settings, memory."""
    lines = []
    tr = st.get("transport", {})
    if "thinker" in tr:
        t = tr["thinker"]
        lines.append(
            f"\nthinker -> talker per thinker step (c={max(args.concurrency)}): build + send p50 "
            f"{t['build_send_us_p50']:.0f} us ({t.get('build_send_cpu_us_p50', float('nan')):.0f} us of CPU), "
            f"{t['wire_bytes_p50'] / 1024:.1f} KiB on the wire p50 "
            f"({t['rows_per_step_mean']:.1f} rows of the last layer and layer {st.get('layer')} per step); "
            f"thinker step p50 {t['step_ms_p50']:.2f} ms"
        )
    if st.get("stage_steps"):
        title = "\nper-stage timeline (last round of each level): steps, step p50 / mean ms, busy share"
        lines += stage_steps_table(title, st["stage_steps"], STAGE_NAMES)
    if "cold_start_s" in st:
        lines.append(f"\ncold start to Ready (stages start in parallel): {st['cold_start_s']:.1f} s")
    growth = f", doubling up to {args.code2wav_max_chunk}" if args.code2wav_max_chunk > args.code2wav_chunk else ""
    lines.append(
        f"code2wav chunks: the first 1 frame, then {args.code2wav_chunk} frames{growth}; "
        f"up to {args.code2wav_max_batch} windows a step"
    )
    lines.append(f"code2wav CUDA graphs: {args.code2wav_graphs}")
    lines.append(f"code2wav MPS client priority: {args.code2wav_priority}")
    lines.append(f"thinker and talker step budget (max_num_batched_tokens): {args.prefill_budget} tokens")
    lines.append(
        f"code2wav float32 matmuls and convolutions: {args.code2wav_matmul} "
        f"({'exact fp32' if args.code2wav_matmul == 'highest' else 'TF32'})"
    )
    if st.get("gpu_sharing"):
        lines.append(f"GPU sharing: {st['gpu_sharing']} (--gpu-sharing {args.gpu_sharing})")
    after = st.get("stage_memory_after") or {}
    for sid, note in (st.get("stage_memory") or {}).items():
        if note:
            later = f"; after the rounds {after[sid]}" if sid in after else ""
            name = STAGE_NAMES[int(sid.split(".")[0])] + (f" replica {sid.split('.')[1]}" if "." in sid else "")
            lines.append(f"{name} GPU memory once started: {note}{later}")
    if st.get("graph_sizes"):
        lines.append(f"thinker and talker CUDA graph sizes (tokens per step): {st['graph_sizes']}")
    return lines


def closed_loop_lines(st: dict[str, Any]) -> list[str]:
    """The closed-loop levels (--closed-loop) beside the published vllm-omni figures."""
    closed = st.get("closed") or {}
    if not closed:
        return []
    pub = PUBLISHED["vllm-omni, 3x H100 (first audio mean, RTF)"]
    lines = [
        "",
        "closed loop (per level c: X x c requests, c in flight, each finished one replaced; vLLM bench serve's "
        "--max-concurrency c --num-prompts X*c, the method of the published vllm-omni figures):",
        "| concurrency | requests | first audio mean / p50 / p90 | RTF | audio s/s | vllm-omni, 3x H100, published "
        "(first audio mean / RTF) |",
        "|---|---|---|---|---|---|",
    ]
    for c, r in closed.items():
        p = pub.get(int(c))
        lines.append(
            f"| {c} | {r['requests']} | {r['first_audio_mean_s'] * 1000:.0f} / {r['first_audio_p50_s'] * 1000:.0f} / "
            f"{r['first_audio_p90_s'] * 1000:.0f} ms | {r['rtf_mean']:.3f} | {r['audio_s_per_s']:.2f} | "
            + (f"{p[0] * 1000:.0f} ms / {p[1]:.3f} |" if p else "- |")
        )
    steps = st.get("closed_stage_steps") or {}
    if steps:
        title = "\nper-stage timeline (closed loop): steps, step p50 / mean ms, busy share"
        lines += stage_steps_table(title, steps, STAGE_NAMES)
    return lines


def target_lines(st: dict[str, Any]) -> list[str]:
    """Issue 22's targets on one H200 against what this run measured, burst rounds and (where
    run) the closed loop."""
    one = st.get("1", {})
    if "first_audio_p50_s" not in one:
        return []
    first1 = one["first_audio_p50_s"]

    def verdict(value: float, limit: float) -> str:
        return "met" if value <= limit else "NOT met"

    gpus = st.get("gpus", 1)
    where = "as measured here" if gpus == 1 else f"set for one H200; this run used {gpus} GPUs"
    lines = ["", f"Targets (issue 22), {where}:"]
    lines.append(f"- first audio p50 at 1 request {first1 * 1000:.0f} ms (<= 250 ms): {verdict(first1, 0.25)}")
    lines.append(f"- RTF at 1 request {one['rtf_mean']:.3f} (<= 0.15): {verdict(one['rtf_mean'], 0.15)}")
    for label, level in (("burst round", st.get("32")), ("closed loop", (st.get("closed") or {}).get("32"))):
        if not level:
            continue
        f = level["first_audio_p50_s"]
        lines.append(
            f"- at 32, {label}: first audio p50 {f * 1000:.0f} ms (<= 2 x {first1 * 1000:.0f} ms): "
            f"{verdict(f, 2 * first1)}; RTF {level['rtf_mean']:.3f} (<= 0.30): {verdict(level['rtf_mean'], 0.30)}"
        )
    return lines


def _published(levels: dict[int, tuple[float | None, float]]) -> list[str]:
    return [f"c={c} " + " / ".join(f"{v:g}" for v in vals if v is not None) for c, vals in levels.items()]


def plot(results: dict[str, Any], args: argparse.Namespace, path: Path, device: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for phase, label in (("stream", "omni_mp, streaming"), ("nostream", "omni_mp, no streaming")):
        xs = [c for c in args.concurrency if str(c) in results.get(phase, {})]
        if xs:
            ax.plot(xs, [results[phase][str(c)]["first_audio_p50_s"] for c in xs], marker="o", label=label)
            ax2.plot(xs, [results[phase][str(c)]["rtf_mean"] for c in xs], marker="o", label=label)
    closed = results.get("stream", {}).get("closed") or {}
    if closed:
        xs = [int(c) for c in closed]
        ax.plot(xs, [r["first_audio_p50_s"] for r in closed.values()], marker="o", ls=":", label="omni_mp, closed loop")
        ax2.plot(xs, [r["rtf_mean"] for r in closed.values()], marker="o", ls=":", label="omni_mp, closed loop")
    for config, peer in peer_docs(args.out, "qwen3_omni").items():  # vllm-omni's Qwen3-Omni runs in --out, if any
        xs = [c for c in args.concurrency if str(c) in peer]
        if xs:
            label = f"vllm-omni {config}, same GPU"
            ax.plot(xs, [peer[str(c)]["first_audio_p50_s"] for c in xs], marker="^", ls="-.", label=label)
            ax2.plot(xs, [peer[str(c)]["rtf_mean"] for c in xs], marker="^", ls="-.", label=label)
    pub = PUBLISHED["vllm-omni, 3x H100 (first audio mean, RTF)"]
    ax.plot(list(pub), [v[0] for v in pub.values()], marker="s", ls="--", label="vllm-omni, 3x H100 (published)")
    ax2.plot(list(pub), [v[1] for v in pub.values()], marker="s", ls="--", label="vllm-omni, 3x H100 (published)")
    pub2 = PUBLISHED["vllm-omni, 2x H100 (RTF)"]
    ax2.plot(list(pub2), [v[1] for v in pub2.values()], marker="s", ls=":", label="vllm-omni, 2x H100 (published)")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent requests")
        a.legend(fontsize=8)
    ax.set_ylabel("time to first audio, p50 (s)")
    ax2.set_ylabel("real-time factor (lower is better)")
    fig.suptitle(f"Qwen3-Omni-30B-A3B {'(smoke)' if args.smoke else 'released sizes'}, {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, the tiny checkpoint, small lengths")
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        choices=sorted(DEVICES),
        help="1: all three stages on GPU 0 (issue 22's targets); 2: the thinker on GPU 0, talker + code2wav on GPU 1",
    )
    p.add_argument(
        "--layout", choices=LAYOUTS, default="split", help="stage replicas (benchmarks/common/replica_layouts.py)"
    )
    p.add_argument("--baseline", type=Path, help="a one-GPU run's --out: report the scaling efficiency against it")
    p.add_argument("--phases", default="stream", help=f"comma-separated, of {PHASES}; '' only renders the report")
    p.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, nargs="+", default=None)
    p.add_argument("--prompt-len", type=int, default=None)
    p.add_argument("--thinker-tokens", type=int, default=None)
    p.add_argument("--talker-frames", type=int, default=None)
    add_stage_args(p)
    p.add_argument(
        "--closed-loop",
        type=int,
        default=0,
        metavar="X",
        help="after the rounds, per level c > 1: X x c requests with c in flight, each finished one replaced "
        "(vLLM bench serve's --max-concurrency c --num-prompts X*c, the published figures' method); 0: off",
    )
    p.add_argument("--deadline-s", type=float, default=None, help="stop starting phases past this (whole run)")
    p.add_argument("--phase-timeout-s", type=float, default=1800)
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "qwen3_omni_gpu")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "qwen3_omni_gpu")
    args = p.parse_args(argv)
    # GPU defaults: the published benchmark's 2500-token prompts; replies shortened from 900 to
    # fit a 10-minute device call at 64 requests (RTF and first audio do not depend on length).
    small = {"concurrency": [1, 4], "prompt_len": 48, "thinker_tokens": 12, "talker_frames": 16}
    full = {"concurrency": [1, 8, 32, 64], "prompt_len": 2500, "thinker_tokens": 200, "talker_frames": 200}
    for k, v in (small if args.smoke else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def add_stage_args(p: argparse.ArgumentParser) -> None:
    """The stages' settings: prefill graphs and step budget, code2wav's precision, priority,
    graphs and chunks, GPU sharing, the AR stages' memory reserve."""
    p.add_argument(
        "--prefill-graphs",
        choices=("on", "off"),
        default="on",
        help="thinker and talker: capture prefill step sizes up to 2048 tokens (off: vLLM's decode sizes only)",
    )
    p.add_argument(
        "--code2wav-matmul",
        choices=("highest", "high"),
        default="high",
        help="code2wav's float32 matmuls and convolutions: high = TF32 tensor cores (stage_configs/qwen3_omni.yaml's), "
        "highest = exact fp32",
    )
    add_gpu_sharing_arg(p)
    p.add_argument(
        "--code2wav-priority",
        choices=("normal", "below_normal"),
        default="below_normal",
        help="code2wav's MPS client priority (stage mps_priority; stage_configs/qwen3_omni.yaml's: below_normal): "
        "below_normal lets the thinker's and talker's kernels go first on the shared GPU; time-sliced it changes "
        "nothing (--smoke: CPU stages, no priority)",
    )
    p.add_argument(
        "--ar-reserve-gib",
        type=float,
        default=AR_RESERVE_GIB,
        help="thinker's and talker's memory.reserve_gib (stage_configs/qwen3_omni.yaml's: 9; the config default 2): "
        "what their budgets keep beyond weights, KV cache and the activation estimate, for CUDA graph pools and "
        "workspaces, out of the KV cache. A larger --prefill-budget needs more",
    )
    p.add_argument(
        "--prefill-budget",
        type=int,
        default=MAX_BATCHED_TOKENS,
        choices=[n for n in PREFILL_GRAPH_SIZES if n >= 2048],
        help="thinker's and talker's tokens per engine step (max_num_batched_tokens; prefill graphs up to it): a "
        "burst of 2500-token prompts is prefilled in larger chunks",
    )
    p.add_argument(
        "--code2wav-graphs",
        choices=("on", "off"),
        default="on",
        help="code2wav's calls replayed from CUDA graphs (diffusion.cuda_graphs, the default: on); off: eager",
    )
    p.add_argument(
        "--code2wav-chunk",
        type=int,
        default=2,
        metavar="FRAMES",
        help="code2wav's second chunk, in frames (stage_configs/qwen3_omni.yaml's: 2); a chunk runs only its new "
        "frames (the decoder keeps its state between chunks)",
    )
    p.add_argument(
        "--code2wav-max-batch",
        type=int,
        default=64,
        help="code2wav windows decoded in one step (stage_configs/qwen3_omni.yaml's: 64; 32 with --code2wav-max-chunk "
        "48, whose longer windows need twice the activations)",
    )
    p.add_argument(
        "--code2wav-max-chunk",
        type=int,
        default=12,
        metavar="FRAMES",
        help="later chunks double up to this many frames (streaming.max_chunk; stage_configs/qwen3_omni.yaml's: 12); "
        "0: all --code2wav-chunk",
    )


def main() -> int:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase:  # a child: run one phase, write its result (or its error, for the report)
        return run_child_phase(args.out / f"{args.phase}.json", lambda: run_pipeline(args, args.phase == "stream"))
    phases = split_phases(args.phases, PHASES)
    if phases:
        t0 = time.perf_counter()
        path = model_dir(args)
        say(f"model dir {path} ready in {time.perf_counter() - t0:.1f}s")
    deadline = T_START + args.deadline_s if args.deadline_s else None
    for phase in phases:
        run_phase_process(
            "benchmarks.qwen3_omni_gpu", phase, args.out, timeout_s=args.phase_timeout_s, say=say,
            deadline=deadline, margin_s=RENDER_MARGIN_S,
        )  # fmt: skip
    results = phase_results(args.out, PHASES)
    device = devices_of(results)
    text = report(results, args, device)
    doc = {"device": device, "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    (args.out / "qwen3_omni_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    if not plot(results, args, args.out / "qwen3_omni_gpu.png", device):
        text += "\n\n(no qwen3_omni_gpu.png: matplotlib is missing on this host)"
    (args.out / "qwen3_omni_gpu.md").write_text(text + "\n")
    print("\n" + text, flush=True)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

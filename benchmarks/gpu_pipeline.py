"""One AR stage against vLLM alone, and the thinker -> talker chain against its first stage,
at concurrency 1/8/32/64 (Qwen2-7B shapes, random weights, bf16, on the GPU).

    python -m benchmarks.gpu_pipeline                       # builds the 7B-shaped config dir
    python -m benchmarks.gpu_pipeline --gpus 2              # the talker on GPU 1
    python -m benchmarks.gpu_pipeline --cpu --model tiny    # a quick dry run on the CPU

Phases run one at a time, each in a fresh process (GPU memory is returned between them):
  vllm       vLLM's `LLM.generate` on the same engine args (its default model runner)
  vllm_v1    the same with the V1 model runner (the one hooked stages use)
  stage_off  one omni_mp stage, hidden-state output off
  stage_on   the same stage streaming the last-layer hidden states of every token
  chain      stage_on feeding a talker (same model shape) step by step
Each phase, per concurrency level: one unmeasured warm-up round at that level (its batch
shapes' first runs: benchmarks.common.warmup), then `--rounds` measured rounds (median); the
report and the JSON say so.
Every request has a distinct random prompt of `--prompt-len` tokens and generates exactly
`--tokens` tokens (ignore_eos). The chain at the highest concurrency also records the
per-step timeline of both stages (`OMNI_MP_PROFILE_DIR`), summarized in the output.
Prints the table with ratios; writes JSON (and a PNG when matplotlib is present).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.phases import REPO, module_cmd
from benchmarks.common.warmup import Warmups, warmup_line

WARMUP = "each level's first round (its prompts' own seeds) unmeasured, before its --rounds measured rounds"
PHASES = ["vllm", "vllm_v1", "stage_off", "stage_on", "chain"]
QWEN2_7B = {  # Qwen2-7B's shapes (config.json of the released checkpoint)
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def build_7b_dir(root: Path) -> Path:
    """A config-only Qwen2-7B-shaped checkpoint dir (weights come from `load_format: dummy`)."""
    from transformers import Qwen2Config

    path = root / "qwen2-7b-shapes"
    if not (path / "config.json").exists():
        cfg = Qwen2Config(**QWEN2_7B, torch_dtype="bfloat16", architectures=["Qwen2ForCausalLM"])
        cfg.save_pretrained(path)
    return path


def engine_args(args: argparse.Namespace, model: str) -> dict[str, Any]:
    if args.cpu:
        return {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": max(args.concurrency), "seed": 0}
    return {
        "dtype": "bfloat16",
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "max_model_len": args.prompt_len + args.tokens + 64,
        "max_num_seqs": max(args.concurrency),
        "gpu_memory_utilization": args.gpu_memory_utilization,
        # A fixed KV budget per engine: two engines profiling one GPU at once cannot size it.
        "kv_cache_memory_bytes": int(args.kv_cache_gib * 2**30),
        "enable_prefix_caching": False,  # hidden-state stages turn it off: the same for all
        "seed": 0,
    }


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


# ---- phases (each runs in its own process) -------------------------------------------------
def run_vllm(args: argparse.Namespace, model: str, v1: bool) -> dict[str, Any]:
    if v1:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, **engine_args(args, model))
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0.0, detokenize=False)
    out: dict[str, Any] = {}
    warmups = Warmups(WARMUP)
    for c in args.concurrency:
        walls = []
        for r in range(args.rounds + 1):  # round 0: the level's warm-up
            batch = [TokensPrompt(prompt_token_ids=p) for p in prompts(c, args.prompt_len, args.vocab, 1000 * c + r)]
            t_round = time.time()
            t0 = time.perf_counter()
            res = llm.generate(batch, params, use_tqdm=False)
            walls.append(time.perf_counter() - t0)
            assert all(len(x.outputs[0].token_ids) == args.tokens for x in res)
            if r == 0:
                warmups.warmed(c, t_round, c)
            else:
                warmups.measured(c, t_round)
        out[str(c)] = {"wall_s": statistics.median(walls[1:]), "rounds": walls}
        print(f"[bench] {args.phase} c={c}: {out[str(c)]['wall_s']:.3f}s", flush=True)
    out["warmup"] = warmups.to_json()
    return out


def pipeline_config(args: argparse.Namespace, model: str) -> dict[str, Any]:
    engine = engine_args(args, model)
    sampling = {"max_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True}
    stage0: dict[str, Any] = {
        "id": 0,
        "model": model,
        "devices": [] if args.cpu else [0],
        "final_output": True,
        "engine_args": engine,
        "sampling": sampling,
    }
    if args.phase in ("stage_on", "chain"):
        stage0["hidden_states"] = {}
    if args.phase != "chain":
        return {"name": args.phase, "stages": [stage0]}
    stage0["final_output"] = False
    talker = {
        "id": 1,
        "model": model,
        "devices": [] if args.cpu else [0 if args.gpus == 1 else 1],
        "inputs": [0],
        "processor": "thinker_to_talker",
        "final_output": True,
        "engine_args": engine,
        "sampling": sampling,
    }
    return {"name": "chain", "timeouts": {"stage_startup_s": 1200}, "stages": [stage0, talker]}


async def pipeline_round(endpoint: str, batch: list[list[int]], tokens: int, stages: list[int]) -> dict[str, Any]:
    from omni_mp.client.omni_client import AsyncOmniClient
    from omni_mp.wire.messages import SamplingParamsMsg

    sampling = {s: SamplingParamsMsg(max_tokens=tokens, ignore_eos=True) for s in stages}
    async with AsyncOmniClient(endpoint) as client:
        t0 = time.perf_counter()
        res = await asyncio.gather(
            *(client.generate(prompt_token_ids=p, sampling=sampling, timeout_s=1200) for p in batch)
        )
        wall = time.perf_counter() - t0
    last = stages[-1]
    first = [
        d.t_first_token - r.t_submit for r in res for d in r.stage_timings if d.stage_id == last and d.t_first_token
    ]
    assert all(len(o.token_ids) == tokens for r in res for o in r.outputs)
    return {"wall_s": wall, "first_chunk_p50_s": statistics.median(first) if first else None}


def run_pipeline(args: argparse.Namespace, model: str) -> dict[str, Any]:
    from omni_mp.config.validate import parse_config
    from omni_mp.control.embedded import embedded_pipeline
    from omni_mp.stage.timeline import PROFILE_DIR_ENV

    cfg = parse_config(pipeline_config(args, model))
    stages = [s.id for s in cfg.stages]
    out: dict[str, Any] = {}
    profile_dir = Path(tempfile.mkdtemp(prefix="omni_mp-profile-"))
    if args.phase == "chain":
        os.environ[PROFILE_DIR_ENV] = str(profile_dir)  # inherited by the stage processes
    t0 = time.perf_counter()
    warmups = Warmups(WARMUP)
    with embedded_pipeline(cfg, progress=lambda m: print(f"[omni_mp] {m}", flush=True)) as coord:
        out["startup_s"] = time.perf_counter() - t0
        for c in args.concurrency:
            rounds = []
            for r in range(args.rounds + 1):  # round 0: the level's warm-up
                batch = prompts(c, args.prompt_len, args.vocab, 1000 * c + r)
                t_round = time.time()
                rounds.append(asyncio.run(pipeline_round(coord.client_endpoint, batch, args.tokens, stages)))
                if r == 0:
                    warmups.warmed(c, t_round, c)
                else:
                    warmups.measured(c, t_round)
            measured = rounds[1:]
            firsts = [x["first_chunk_p50_s"] for x in measured if x["first_chunk_p50_s"] is not None]
            out[str(c)] = {
                "wall_s": statistics.median(x["wall_s"] for x in measured),
                "first_chunk_p50_s": statistics.median(firsts) if firsts else None,
                "rounds": [x["wall_s"] for x in rounds],
            }
            print(f"[bench] {args.phase} c={c}: {out[str(c)]['wall_s']:.3f}s", flush=True)
    out["warmup"] = warmups.to_json()
    if args.phase == "chain":
        out["profile"] = summarize_profile(profile_dir, t_round)  # the last round (highest concurrency)
    return out


def summarize_profile(profile_dir: Path, since: float) -> dict[str, Any]:
    """Per stage, over the steps that started after `since` (the last round): steps, step
    time, time waiting for input, requests per step, rows moved, build and send time."""
    summary: dict[str, Any] = {}
    for path in sorted(profile_dir.glob("stage*.json")):
        doc = json.loads(path.read_text())
        fields = doc["fields"]
        last = [r for r in (dict(zip(fields, s, strict=True)) for s in doc["steps"]) if r["t"] >= since]
        span = last[-1]["t"] - last[0]["t"] + last[-1]["step_ms"] / 1000 if last else 0.0

        def mean(key: str, rows: list[dict[str, Any]] = last) -> float:
            return statistics.fmean(r[key] for r in rows) if rows else 0.0

        busy = sum(r["step_ms"] for r in last) / 1000
        summary[f"stage{doc['stage_id']}"] = {
            "steps": len(last),
            "span_s": span,
            "busy_s": busy,
            "step_ms_mean": mean("step_ms"),
            "wait_ms_mean": mean("wait_ms"),
            "wait_ms_total": sum(r["wait_ms"] for r in last),
            "reqs_per_step_mean": mean("reqs"),
            "rows_per_step_mean": mean("rows"),
            "build_ms_mean": mean("build_ms"),
            "send_ms_mean": mean("send_ms"),
            # CPU time of the same threads (the wall times above include waits for the GIL)
            "build_cpu_ms_mean": mean("build_cpu_ms"),
            "send_cpu_ms_mean": mean("send_cpu_ms"),
        }
    return summary


# ---- orchestration ---------------------------------------------------------------------------
def run_phase_process(args: argparse.Namespace, phase: str, out_dir: Path) -> dict[str, Any]:
    result = out_dir / f"{phase}.json"
    cmd = module_cmd("benchmarks.gpu_pipeline", "--phase", phase, "--result", str(result), *sys.argv[1:])
    print(f"[bench] phase {phase} ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, timeout=args.phase_timeout_s)
    if proc.returncode != 0:
        print(f"[bench] phase {phase} failed with exit code {proc.returncode}", flush=True)
        return {"error": f"exit code {proc.returncode}"}
    data = json.loads(result.read_text())
    data["phase_s"] = time.perf_counter() - t0
    return data


def table(results: dict[str, Any], args: argparse.Namespace, device: str) -> str:
    def wall(phase: str, c: int) -> float | None:
        return results.get(phase, {}).get(str(c), {}).get("wall_s")

    lines = [
        f"{device}; {args.model}; {args.prompt_len}-token prompts, {args.tokens} generated tokens per request, "
        f"greedy, ignore_eos; median of {args.rounds} rounds",
        *[line for phase in PHASES if (line := warmup_line(results.get(phase, {}).get("warmup"), phase))],
        "",
        "| concurrency | vLLM `LLM.generate` | vLLM, V1 runner | one stage, hidden off | one stage, hidden on "
        "| chain (stage 0 -> talker) | talker first chunk p50 |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(phase: str, c: int, ref: str | None, label: str) -> str:
        w, base = wall(phase, c), wall(ref, c) if ref else None
        if w is None:
            return "-"
        return f"{w:.3f} s" + (f" ({base / w:.2f}x {label})" if base else "")

    for c in args.concurrency:
        first = results.get("chain", {}).get(str(c), {}).get("first_chunk_p50_s")
        lines.append(
            f"| {c} | {cell('vllm', c, None, '')} | {cell('vllm_v1', c, 'vllm', 'vLLM')} "
            f"| {cell('stage_off', c, 'vllm', 'vLLM')} | {cell('stage_on', c, 'stage_off', 'off')} "
            f"| {cell('chain', c, None, '')}"
            + (
                f" ({wall('chain', c) / wall('stage_on', c):.2f}x stage 0)"
                if wall("chain", c) and wall("stage_on", c)
                else ""
            )
            + f" | {'-' if first is None else f'{first * 1000:.0f} ms'} |"
        )
    lines.append("")
    lines.append("Ratios: vLLM/stage = throughput relative to vLLM (>= 0.95 wanted); off/on = hidden-state cost;")
    lines.append("chain/stage 0 = end-to-end time of the chain against its first stage alone (<= 1.10 wanted).")
    prof = results.get("chain", {}).get("profile")
    if prof:
        lines.append("")
        lines.append(f"Chain timeline at concurrency {max(args.concurrency)} (last round):")
        lines.append(
            "| stage | steps | span s | busy s | step ms | wait ms/step | reqs/step | rows/step | build ms (CPU) "
            "| send ms (CPU) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for name, s in prof.items():
            lines.append(
                f"| {name} | {s['steps']} | {s['span_s']:.3f} | {s['busy_s']:.3f} | {s['step_ms_mean']:.2f} "
                f"| {s['wait_ms_mean']:.2f} | {s['reqs_per_step_mean']:.1f} | {s['rows_per_step_mean']:.1f} "
                f"| {s['build_ms_mean']:.2f} ({s.get('build_cpu_ms_mean', 0.0):.2f}) "
                f"| {s['send_ms_mean']:.2f} ({s.get('send_cpu_ms_mean', 0.0):.2f}) |"
            )
    return "\n".join(lines)


def plot(results: dict[str, Any], args: argparse.Namespace, path: Path, device: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib missing: no plot", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for phase in PHASES:
        xs = [c for c in args.concurrency if results.get(phase, {}).get(str(c))]
        if xs:
            ax.plot(xs, [results[phase][str(c)]["wall_s"] for c in xs], marker="o", label=phase)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel(f"wall time for {args.tokens} tokens per request (s)")
    ax.set_title(f"omni_mp vs vLLM, {device}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"[bench] wrote {path}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--gpus", type=int, default=1, choices=[1, 2], help="2: the chain's talker on GPU 1")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.42)
    p.add_argument("--kv-cache-gib", type=float, default=8.0, help="KV cache of every engine (GPU)")
    p.add_argument("--cpu", action="store_true", help="dry run on the CPU")
    p.add_argument("--model", default="qwen2-7b-shapes", help="qwen2-7b-shapes (built) or a tiny model name / dir")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "omni_mp-gpu-bench")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "gpu_pipeline")
    p.add_argument("--phase-timeout-s", type=float, default=1500)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.model == "qwen2-7b-shapes":
        model, args.vocab = str(build_7b_dir(args.work_dir)), QWEN2_7B["vocab_size"]
    else:
        from omni_mp.models.registry import resolve_model

        model = resolve_model(args.model)
        args.vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    if args.phase:  # a child: run one phase, write its result
        data = (
            run_vllm(args, model, args.phase == "vllm_v1")
            if args.phase.startswith("vllm")
            else run_pipeline(args, model)
        )
        args.result.write_text(json.dumps(data))
        return 0
    import torch

    device = "CPU" if args.cpu else torch.cuda.get_device_name(0)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for phase in args.phases.split(","):
        results[phase] = run_phase_process(args, phase, args.out)
    text = table(results, args, device)
    print("\n" + text, flush=True)
    doc = {"device": device, "args": {k: v for k, v in vars(args).items() if k not in ("work_dir", "out", "result")}}
    (args.out / "gpu_pipeline.json").write_text(json.dumps({**doc, "results": results}, indent=1, default=str))
    (args.out / "gpu_pipeline.md").write_text(text + "\n")
    plot(results, args, args.out / "gpu_pipeline.png", device)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Qwen2.5-Omni at 7B shapes (random weights), omni_mp against transformers (issue 12).

    python benchmarks/omni_gpu.py --gpus 2       # thinker on GPU 0, talker + token2wav on GPU 1 (budgets there)
    python benchmarks/omni_gpu.py --gpus 1       # all three on GPU 0, with memory budgets
    python benchmarks/omni_gpu.py --smoke        # CPU, tiny sizes: checks the script runs

Phases, each in a fresh subprocess (GPU memory returned between them); each writes
`<out>/<phase>.json`, and the report is made from every phase file in `--out`, so phases can
run in separate invocations (a device call has a 10-minute limit) and still make one table:
  hf        transformers `Qwen2_5OmniForConditionalGeneration` built from the same config on the
            GPU in bf16 (token2wav fp32), `generate()` with fixed lengths: one request at a time,
            then batched (up to --hf-max-batch). No streaming: first audio = end of generate.
  stream    omni_mp thinker -> talker -> token2wav through the embedded client, streaming
            between stages; per concurrency: time to first audio chunk (p50/p90), RTF, audio
            seconds per second, thinker tokens/s; the thinker -> talker per-step transport
            cost from the stage timelines at the highest concurrency; cold start (all stages
            start in parallel) to Ready.
  nostream  the same with `wait_for_upstream: true` on the talker and token2wav (each starts
            when its upstream finished) and one-shot token2wav.
  cold0, cold1, cold2   each stage alone: time to Ready.
Every request has a distinct random prompt of --prompt-len ids and does exactly
--thinker-tokens thinker tokens and --talker-codes codes (EOS ignored; 50 codes = 1 s of audio).
Outputs: omni_gpu.json, omni_gpu.md (the README table), omni_gpu.png (latency vs concurrency).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
PHASES = ["hf", "stream", "nostream", "cold0", "cold1", "cold2"]
CODEC_IDS = 8192  # real codec ids; the rest of the talker's 8448 are control ids (pad, bos, eos, ...)
SAMPLES_PER_CODE, SAMPLE_RATE = 480, 24000
# Memory budgets of thinker / talker / token2wav as fractions of a device, per layout.
# transformers' default talker is as wide as the thinker, so they get similar shares; token2wav
# has no KV cache. With --gpus 2 the talker and token2wav share GPU 1: budgets there too, so
# the talker's KV cache does not take a fixed 90% of it while token2wav loads beside it.
SHARES = {1: (0.42, 0.38, 0.12), 2: (0.85, 0.7, 0.15)}


def say(msg: str) -> None:
    print(f"[omni_gpu] {msg}", flush=True)


def prompts(n: int, length: int, seed: int, vocab: tuple[int, int] = (1000, 150000)) -> list[list[int]]:
    """Distinct random prompts; the default id range is plain text ids of the Qwen2.5 vocab."""
    rng = random.Random(seed)
    return [[rng.randrange(*vocab) for _ in range(length)] for _ in range(n)]


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def model_dir(args: argparse.Namespace) -> Path:
    from omni_mp.models.qwen2_5_omni_shapes import OmniShapesSpec, build_omni_shapes

    return build_omni_shapes(OmniShapesSpec(scale=28 if args.smoke else 1), cache_dir=args.work_dir)


# ---- transformers -----------------------------------------------------------------------------
def run_hf(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList, Qwen2_5OmniForConditionalGeneration

    from omni_mp.models.qwen2_5_omni_shapes import OmniShapesSpec, omni_shapes_config

    class RealCodecsOnly(LogitsProcessor):
        """Random weights may pick any of the 8448 talker ids; token2wav embeds only the real
        codec ids, and EOS is ignored anyway (min_new_tokens), so the rest are masked."""

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            scores[:, CODEC_IDS:] = -float("inf")
            return scores

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = omni_shapes_config(OmniShapesSpec(scale=28 if args.smoke else 1))
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
        return wall, sum(w.numel() for w in wavs) / SAMPLE_RATE

    out: dict[str, Any] = {"build_s": build_s, "device": str(device)}
    generate(prompts(1, args.prompt_len, 7))  # warm-up
    walls, audio = [], 0.0
    for r in range(args.rounds):
        wall, audio = generate(prompts(1, args.prompt_len, 100 + r))
        walls.append(wall)
        say(f"hf: one request {wall:.2f}s, {audio:.2f}s of audio")
    one = statistics.median(walls)
    out["single"] = {"wall_s": one, "walls": walls, "audio_s": audio, "thinker_tok_s": n / one, "rtf": one / audio}
    batched: dict[str, Any] = {}
    for c in args.concurrency:
        if c == 1 or c > args.hf_max_batch:
            continue
        try:
            wall, audio_b = generate(prompts(c, args.prompt_len, 1000 + c))
        except Exception as err:  # noqa: BLE001 - recorded in the report: batching is optional
            batched[str(c)] = {"error": f"{type(err).__name__}: {err}"[:500]}
            say(f"hf: batch {c} failed: {batched[str(c)]['error']}")
            break
        batched[str(c)] = {"wall_s": wall, "audio_s": audio_b, "thinker_tok_s": c * n / wall}
        say(f"hf: batch {c} {wall:.2f}s")
    out["batched"] = batched
    return out


# ---- omni_mp ----------------------------------------------------------------------------------
def omni_missing() -> list[str]:
    """The omni pipeline pieces this checkout lacks (the smoke run then uses a stand-in)."""
    from omni_mp.config import StageConfig
    from omni_mp.processors import PROCESSORS
    from omni_mp.wire.payload import SamplingParamsMsg

    missing = []
    if "qwen2_5_omni_talker" not in PROCESSORS:
        missing.append("processor qwen2_5_omni_talker")
    for field in ("model_part", "wait_for_upstream"):
        if field not in StageConfig.__struct_fields__:
            missing.append(f"stage field {field}")
    if "allowed_token_ids" not in SamplingParamsMsg.__struct_fields__:
        # A random talker picks control ids (>= 8193) now and then; token2wav cannot embed them.
        missing.append("sampling allowed_token_ids (to keep a random talker on real codec ids)")
    return missing


def budgets_gib(args: argparse.Namespace) -> list[float]:
    if args.budgets_gib:
        return [float(x) for x in args.budgets_gib.split(",")]
    from omni_mp.control.memory_budget import GiB, query_devices

    devices = query_devices()
    if not devices or any(d not in devices for d in range(args.gpus)):
        raise SystemExit(f"--gpus {args.gpus} needs GPUs 0..{args.gpus - 1} to size the budgets (or --budgets-gib)")
    return [round(devices[0].total_bytes * f / GiB, 1) for f in SHARES[args.gpus]]


def omni_pipeline(args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """The pipeline of stage_configs/qwen2_5_omni.yaml's shape at the benchmark's sizes."""
    from omni_mp.models.qwen2_5_omni_shapes import thinker_engine_args

    model = str(model_dir(args))
    conc = max(args.concurrency)
    devs = [[0], [1], [1]] if args.gpus == 2 else [[0], [0], [0]]
    common = {"dtype": "bfloat16", "load_format": "dummy", "skip_tokenizer_init": True, "seed": 0}
    common.update({"max_num_seqs": conc, "enable_prefix_caching": False})
    fixed = {"temperature": 0.0, "ignore_eos": True}
    thinker = {
        "id": 0, "model": model, "devices": devs[0], "hidden_states": {},
        "engine_args": {**common, **thinker_engine_args(), "max_model_len": args.prompt_len + args.thinker_tokens + 64},
        "sampling": {**fixed, "max_tokens": args.thinker_tokens, "min_tokens": args.thinker_tokens},
    }  # fmt: skip
    talker = {
        "id": 1, "model": model, "model_part": "talker", "devices": devs[1], "inputs": [0],
        "processor": "qwen2_5_omni_talker",
        "engine_args": {**common, "max_model_len": args.prompt_len + args.talker_codes + 64},
        "sampling": {
            **fixed, "max_tokens": args.talker_codes, "min_tokens": args.talker_codes,
            "allowed_token_ids": list(range(CODEC_IDS)),
        },
    }  # fmt: skip
    token2wav = {
        "id": 2, "model": model, "kind": "diffusion", "devices": devs[2], "inputs": [1],
        "processor": "codec_tokens", "final_output": True, "engine_args": {"max_model_len": 4096},
        "sampling": {"seed": 0},
        "diffusion": {"default_speaker": "Chelsie", "max_batch": min(conc, 64), "stream": stream},
    }  # fmt: skip
    stages = [thinker, talker, token2wav]
    if not stream:
        talker["wait_for_upstream"] = token2wav["wait_for_upstream"] = True
    for s, gib in zip(stages, budgets_gib(args), strict=True):
        s["memory"] = {"gpu_gib": gib}
    return {"name": "qwen2_5_omni_bench", "timeouts": {"stage_startup_s": 1200}, "stages": stages}


def standin_pipeline(args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """CPU smoke stand-in (tiny_tts's shape): a tiny AR stage whose ids are codec ids, then token2wav."""
    stage0 = {
        "id": 0, "model": "tiny-qwen2",
        "engine_args": {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 16},
        "sampling": {"max_tokens": args.talker_codes, "temperature": 0.0, "ignore_eos": True},
    }  # fmt: skip
    token2wav = {
        "id": 1, "model": "tiny-token2wav", "kind": "diffusion", "inputs": [0], "processor": "codec_tokens",
        "final_output": True, "engine_args": {"max_model_len": 4096}, "sampling": {"seed": 0},
        "diffusion": {"default_speaker": "Chelsie", "max_batch": 16, "stream": stream},
    }  # fmt: skip
    return {"name": "standin_tts", "stages": [stage0, token2wav]}


def pipeline_dict(args: argparse.Namespace, stream: bool) -> tuple[dict[str, Any], str | None]:
    missing = omni_missing()
    if not stream and "stage field wait_for_upstream" in missing and not args.smoke:
        raise SystemExit("streaming off needs the `wait_for_upstream` stage field")
    if not missing:
        return omni_pipeline(args, stream), None
    if not args.smoke:
        raise SystemExit(f"this checkout lacks the omni pipeline pieces: {', '.join(missing)}")
    return standin_pipeline(args, stream), f"stand-in pipeline tiny-qwen2 -> tiny-token2wav (missing: {missing})"


async def _request(client: Any, prompt: list[int], t0: float) -> dict[str, Any]:
    from omni_mp.audio import chunk_audio
    from omni_mp.wire.payload import Finished

    first, samples, rate, fin = None, 0, SAMPLE_RATE, None
    async for ev in client.stream(prompt_token_ids=prompt, timeout_s=1800):
        now = time.perf_counter()
        if isinstance(ev, Finished):
            fin = ev
            break
        got = chunk_audio(ev.additional_information)
        if got is not None and got[0].numel():
            first = first if first is not None else now
            samples, rate = samples + got[0].numel(), got[1]
    done = time.perf_counter()
    assert fin is not None
    for out in fin.outputs:  # one-shot stages deliver the audio with Finished
        if out.audio is not None and out.sample_rate:
            samples, rate = max(samples, out.audio.numel()), out.sample_rate
            first = first if first is not None else done
    entry = min(fin.stage_timings, key=lambda d: d.stage_id)
    return {
        "first_s": (first if first is not None else done) - t0,
        "done_s": done - t0,
        "audio_s": samples / rate,
        "thinker_tokens": entry.num_output_tokens,
    }


async def _round(endpoint: str, batch: list[list[int]]) -> dict[str, Any]:
    from omni_mp.client import AsyncOmniClient

    async with AsyncOmniClient(endpoint) as client:
        t0 = time.perf_counter()
        reqs = await asyncio.gather(*(_request(client, p, t0) for p in batch))
        wall = time.perf_counter() - t0
    firsts = [r["first_s"] for r in reqs]
    audio = sum(r["audio_s"] for r in reqs)
    return {
        "wall_s": wall,
        "first_audio_p50_s": statistics.median(firsts),
        "first_audio_p90_s": percentile(firsts, 0.9),
        # per request: time from submit to its last audio over the audio's length
        "rtf_mean": statistics.fmean(r["done_s"] / r["audio_s"] for r in reqs if r["audio_s"]),
        "audio_s_per_s": audio / wall,
        "thinker_tok_s": sum(r["thinker_tokens"] for r in reqs) / wall,
        "audio_s_per_request": audio / len(reqs),
    }


def run_pipeline(args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    from omni_mp.config import parse_config
    from omni_mp.control.embedded import embedded_pipeline
    from omni_mp.stage.timeline import PROFILE_DIR_ENV

    data, note = pipeline_dict(args, stream)
    cfg = parse_config(data)
    profile_dir = Path(tempfile.mkdtemp(prefix="omni_gpu-profile-"))
    if stream:
        os.environ[PROFILE_DIR_ENV] = str(profile_dir)  # inherited by the stage processes
    out: dict[str, Any] = {"note": note, "pipeline": cfg.name}
    vocab = (10, 300) if note else (1000, 150000)  # the stand-in's tiny-qwen2 has 320 ids
    t0 = time.perf_counter()
    t_last = time.time()
    with embedded_pipeline(cfg, progress=lambda m: say(m)) as coord:
        out["cold_start_s"] = time.perf_counter() - t0
        for c in args.concurrency:
            runs = []
            for r in range(args.rounds + 1):  # the first is a warm-up
                t_last = time.time()
                batch = prompts(c, args.prompt_len, 1000 * c + r, vocab)
                runs.append(asyncio.run(_round(coord.client_endpoint, batch)))
            best = min(runs[1:], key=lambda x: x["wall_s"])
            out[str(c)] = best
            say(
                f"{'stream' if stream else 'nostream'} c={c}: "
                f"first audio p50 {best['first_audio_p50_s'] * 1000:.0f} ms, "
                f"RTF {best['rtf_mean']:.3f}, {best['audio_s_per_s']:.2f} audio s/s"
            )
    if stream:
        out["transport"] = transport_summary(profile_dir, t_last)
    return out


def transport_summary(profile_dir: Path, since: float) -> dict[str, Any]:
    """Entry stage (thinker) steps of the last round that emitted hidden-state rows: p50 of
    the host time to build and send one step's outputs downstream, and of its wire bytes."""
    files = sorted(profile_dir.glob("stage0-*.json"))
    if not files:
        return {"error": f"no stage 0 timeline in {profile_dir}"}
    doc = json.loads(files[-1].read_text())
    rows = [dict(zip(doc["fields"], s, strict=True)) for s in doc["steps"]]
    steps = [r for r in rows if r["t"] >= since and r["rows"] > 0]
    if not steps:
        return {"error": "no steps with hidden-state rows"}
    return {
        "steps": len(steps),
        "build_send_us_p50": 1000 * statistics.median(r["build_ms"] + r["send_ms"] for r in steps),
        "build_us_p50": 1000 * statistics.median(r["build_ms"] for r in steps),
        "send_us_p50": 1000 * statistics.median(r["send_ms"] for r in steps),
        "wire_bytes_p50": statistics.median(r["wire_bytes"] for r in steps),
        "reqs_per_step_mean": statistics.fmean(r["reqs"] for r in steps),
        "step_ms_p50": statistics.median(r["step_ms"] for r in steps),
    }


def run_cold(args: argparse.Namespace, stage_id: int) -> dict[str, Any]:
    """One stage alone as its own pipeline: time until it is Ready."""
    from omni_mp.config import parse_config
    from omni_mp.control.embedded import embedded_pipeline

    data, note = pipeline_dict(args, True)
    stages = [s for s in data["stages"] if s["id"] == stage_id]
    if not stages:
        return {"skipped": f"no stage {stage_id}", "note": note}
    stage = {k: v for k, v in stages[0].items() if k not in ("inputs", "processor", "wait_for_upstream")}
    stage.update(final_output=True)  # the same stage otherwise (hidden-state output included)
    cfg = parse_config({**data, "stages": [stage]})
    t0 = time.perf_counter()
    with embedded_pipeline(cfg, progress=lambda m: say(m)):
        ready = time.perf_counter() - t0
    return {"ready_s": ready, "note": note}


# ---- report -----------------------------------------------------------------------------------
def hf_latency(hf: dict[str, Any], c: int) -> tuple[float | None, float | None]:
    """transformers' first-audio p50 at concurrency c: one at a time (a queue: the median request
    waits for half the others), and batched where measured."""
    one = hf.get("single", {}).get("wall_s")
    serial = one * ((c + 1) // 2 if c > 1 else 1) if one else None
    b = hf.get("batched", {}).get(str(c), {}).get("wall_s")
    return serial, (one if c == 1 else b)


def report(results: dict[str, Any], args: argparse.Namespace, device: str) -> str:
    hf, st, ns = results.get("hf", {}), results.get("stream", {}), results.get("nostream", {})
    lines = [
        f"{device}; Qwen2.5-Omni {'tiny (smoke)' if args.smoke else '7B shapes'}, random weights; "
        f"--gpus {args.gpus}; {args.prompt_len}-id prompts, {args.thinker_tokens} thinker tokens, "
        f"{args.talker_codes} codes ({args.talker_codes / 50:.2f} s of audio) per request, EOS ignored",
    ]
    notes = {r.get("note") for r in results.values() if isinstance(r, dict) and r.get("note")}
    lines += [f"NOTE: {n}" for n in sorted(notes)]
    if "single" in hf:
        s = hf["single"]
        lines.append(
            f"transformers generate(), one request: {s['wall_s']:.2f} s, {s['thinker_tok_s']:.1f} thinker tok/s, "
            f"RTF {s['rtf']:.3f}, {s['audio_s'] / s['wall_s']:.2f} audio s/s"
        )
    lines += [
        "",
        "| concurrency | first audio p50 / p90 (stream) | no stream p50 | transformers p50 (queued / batched) "
        "| RTF (stream) | audio s/s (stream) | vs transformers | thinker tok/s | vs transformers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f} ms"

    single = hf.get("single", {})
    for c in args.concurrency:
        a, b = st.get(str(c), {}), ns.get(str(c), {})
        serial, batched = hf_latency(hf, c)
        hf_b = hf.get("batched", {}).get(str(c), {})
        # transformers' best throughput at c: batched where measured, else one at a time
        hf_rates = [single["audio_s"] / single["wall_s"]] if single else []
        hf_rates += [hf_b["audio_s"] / hf_b["wall_s"]] if "wall_s" in hf_b else []
        hf_audio = max(hf_rates, default=0.0)
        hf_tok = max(single.get("thinker_tok_s", 0), hf_b.get("thinker_tok_s", 0))

        def ratio(x: float | None, base: float) -> str:
            return f"{x / base:.1f}x" if x and base else "-"

        p = f"{ms(a.get('first_audio_p50_s'))} / {ms(a.get('first_audio_p90_s'))}" if a else "-"
        lines.append(
            f"| {c} | {p} | {ms(b.get('first_audio_p50_s'))} | {ms(serial)} / {ms(batched)} "
            f"| {a.get('rtf_mean', float('nan')):.3f} | {a.get('audio_s_per_s', float('nan')):.2f} "
            f"| {ratio(a.get('audio_s_per_s'), hf_audio)} | {a.get('thinker_tok_s', float('nan')):.0f} "
            f"| {ratio(a.get('thinker_tok_s'), hf_tok)} |"
        )
    tr = st.get("transport", {})
    if "build_send_us_p50" in tr:
        lines.append(
            f"\nthinker -> talker per step (c={max(args.concurrency)}, {tr['steps']} steps, "
            f"{tr['reqs_per_step_mean']:.1f} requests/step): build + send p50 {tr['build_send_us_p50']:.0f} us "
            f"(build {tr['build_us_p50']:.0f}, send {tr['send_us_p50']:.0f}; goal <= 60 us), "
            f"{tr['wire_bytes_p50'] / 1024:.1f} KiB on the wire; thinker step p50 {tr['step_ms_p50']:.2f} ms"
        )
    elif "error" in tr:
        lines.append(f"\nthinker -> talker per step: not measured ({tr['error']})")
    colds = {k: v["ready_s"] for k, v in results.items() if k.startswith("cold") and "ready_s" in v}
    if "cold_start_s" in st:
        alone = ", ".join(f"stage {k[4:]} {v:.1f} s" for k, v in sorted(colds.items())) or "not measured"
        slowest = max(colds.values()) if colds else None
        extra = f" ({st['cold_start_s'] / slowest:.2f}x the slowest stage)" if slowest else ""
        lines.append(f"\ncold start to Ready: whole pipeline {st['cold_start_s']:.1f} s{extra}; alone: {alone}")
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    lines += [f"\nphase {k} failed: {e}" for k, e in failed.items()]
    return "\n".join(lines)


def plot(results: dict[str, Any], args: argparse.Namespace, path: Path, device: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib missing: no plot")
        return
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    cs = args.concurrency
    for phase, label in (("stream", "omni_mp, streaming"), ("nostream", "omni_mp, no streaming")):
        xs = [c for c in cs if str(c) in results.get(phase, {})]
        if xs:
            ax.plot(xs, [results[phase][str(c)]["first_audio_p50_s"] for c in xs], marker="o", label=label)
            ax2.plot(xs, [results[phase][str(c)]["audio_s_per_s"] for c in xs], marker="o", label=label)
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


# ---- orchestration ----------------------------------------------------------------------------
def run_phase_process(args: argparse.Namespace, phase: str) -> dict[str, Any]:
    result = args.out / f"{phase}.json"
    cmd = [sys.executable, __file__, "--phase", phase, *sys.argv[1:]]
    say(f"phase {phase} ...")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, timeout=args.phase_timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    if code != 0 or not result.exists():
        data: dict[str, Any] = {"error": f"exit code {code}"}
        result.write_text(json.dumps(data))
        return data
    data = json.loads(result.read_text())
    data["phase_s"] = time.perf_counter() - t0
    result.write_text(json.dumps(data))
    return data


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--gpus", type=int, default=2, choices=[1, 2])
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    p.add_argument("--thinker-tokens", type=int, default=128)
    p.add_argument("--talker-codes", type=int, default=250, help="codes per request (50 = 1 s of audio)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1, help="measured rounds after one warm-up; best kept")
    p.add_argument("--hf-max-batch", type=int, default=8, help="largest transformers batch tried")
    p.add_argument("--budgets-gib", help="thinker,talker,token2wav GPU budgets (default: SHARES of the device)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: a check that every phase runs")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "omni_gpu-models")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "omni_gpu")
    p.add_argument("--phase-timeout-s", type=float, default=1500)
    args = p.parse_args(argv)
    if args.smoke:
        args.gpus = 1
        if "--concurrency" not in (argv or sys.argv):
            args.concurrency = [1, 2]
        if "--thinker-tokens" not in (argv or sys.argv):
            args.thinker_tokens = 8
        if "--talker-codes" not in (argv or sys.argv):
            args.talker_codes = 36
        if "--prompt-len" not in (argv or sys.argv):
            args.prompt_len = 16
        args.hf_max_batch = min(args.hf_max_batch, 2)
    return args


def main() -> int:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase:  # a child: run one phase, write its result
        if args.phase == "hf":
            data = run_hf(args)
        elif args.phase in ("stream", "nostream"):
            data = run_pipeline(args, args.phase == "stream")
        else:
            data = run_cold(args, int(args.phase[4:]))
        (args.out / f"{args.phase}.json").write_text(json.dumps(data))
        return 0
    t0 = time.perf_counter()
    path = model_dir(args)  # once, before any phase (the phases reuse the cached dir)
    say(f"model dir {path} ready in {time.perf_counter() - t0:.1f}s")
    for phase in filter(None, args.phases.split(",")):  # none: only re-render the report
        run_phase_process(args, phase)
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    results = {f.stem: json.loads(f.read_text()) for f in sorted(args.out.glob("*.json")) if f.stem in PHASES}
    text = report(results, args, device)
    print("\n" + text, flush=True)
    doc = {"device": device, "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    (args.out / "omni_gpu.json").write_text(json.dumps(doc, indent=1, default=str))
    (args.out / "omni_gpu.md").write_text(text + "\n")
    plot(results, args, args.out / "omni_gpu.png", device)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

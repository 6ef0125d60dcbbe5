"""vllm-omni 0.25.0rc1 as a black box, measured like benchmarks.omni_gpu measures omni_mp's
stream phase (issue 20; --family qwen2_5_omni, the default) or like benchmarks.qwen3_omni_gpu
measures omni_mp's Qwen3-Omni-30B-A3B (--family qwen3_omni): same model dir, same prompts, same
fixed lengths, same fields.

vllm-omni runs through its own offline API, `vllm_omni.AsyncOmni(model=DIR, deploy_config=YAML)`
(the engine behind `vllm serve DIR --omni --deploy-config YAML`, without HTTP): one `generate()`
per request, all of a round's requests submitted at once. Its Qwen2.5-Omni pipeline runs
token2wav once, after the talker finished a request: its first audio is its last, and the time
at which a request's audio output reaches the caller is both.

Configs (overlay YAMLs on vllm-omni's shipped deploy/qwen2_5_omni.yaml, benchmarks/peer/):
  shipped   qwen2_5_omni_1gpu.yaml: the shipped settings (max_num_seqs 1, eager) on one GPU
  seqs64    qwen2_5_omni_1gpu_seqs64.yaml: the same with max_num_seqs 64 on every stage
Model dir: benchmarks.omni_gpu's (benchmarks.common.checkpoints.qwen2_5_omni_dir: the shapes dir
of omni_mp/models/qwen2_5_omni/shapes.py plus tokenizer and processor files,
benchmarks.common.omni_bench_dir), random weights
(`load_format: dummy` on every stage; vllm-omni builds the audio and vision towers too).
Per request: a distinct prompt of --prompt-len ids (rounds.token_prompts, the same seeds), the
thinker writes exactly --thinker-tokens tokens (ignore_eos), the talker exactly --talker-codes
codes (ignore_eos; logit_bias -100 on every id past the 8192 real codec ids, as omni_mp
suppresses the control ids: a random talker never stops early and token2wav gets real codes only). Every
request's thinker token count and audio length are checked (a round that differs fails).
Output: `<out>/vllm_omni_<config>.json` with omni_gpu's stream-phase fields per level
("1", "8", ...: wall_s, first_audio_p50_s, first_audio_p90_s, rtf_mean, audio_s_per_s,
thinker_tok_s, audio_s_per_request) plus cold_start_s, and "error" / per-level "errors" when a
run fails: a failed run is written with its error, never dropped. benchmarks.omni_gpu's report
reads these files from its --out (benchmarks.common.peer_report).
Each level is warmed up before it is measured, as omni_mp's are (benchmarks.common.warmup): one
unmeasured round of that level's requests (at most as many as the stages batch: at
max_num_seqs 1, two requests already overlap all stages) with the omni_mp benchmarks' warm-up
prompts; the result file's "warmup" records when each ran.

Qwen3-Omni (--family qwen3_omni; FAMILIES below): vllm-omni's shipped deploy/qwen3_omni_moe.yaml
(thinker -> talker -> code2wav, async chunks: code2wav decodes 4 frames first, then 25 at a
time, and each decoded chunk reaches the caller as its own output) on one GPU through
benchmarks/peer/qwen3_omni_1gpu.yaml (`shipped`; every override and its reason is in that file).
Model dir: benchmarks.qwen3_omni_gpu's (config.json of tiny.released_config(), random code2wav
tensors) plus a tokenizer with the released special-token ids and the tiny checkpoint's
processor and chat template (checkpoints.qwen3_omni_processor_dir), cached beside it
in benchmarks.qwen3_omni_gpu's --work-dir (/tmp/qwen3_omni_gpu): the same checkpoint files, hard-linked.
Prompts: rounds.chat_prompts (distinct chat-format user turns of --prompt-len ids, the
warm-ups' seeds warmup_seed(level) and the levels' seeds 1000 x level). Per request the thinker writes exactly
--thinker-tokens tokens and the talker exactly --talker-frames frames (min = max tokens =
frames + 1: the last sampled code makes no frame; the codec control ids >= the codebook
suppressed by logit_bias, the stop id masked by min_tokens: a random talker never stops early
and code2wav gets real codes only). The code2wav stage's outputs are DELTA (each carries the
audio decoded since the previous): first audio = the first output with audio samples, last
audio = the last one, a request's audio = their sum, checked against frames x 1920 samples at
24 kHz (16.0 s for 200): every request of a round alike, none longer, at most one frame short
(--audio-tolerance; vllm-omni's causal decoder leaves a fixed tail of samples off the first
chunk). Result file: `<out>/vllm_omni_qwen3_omni_<config>[.<part>].json` (same fields, "family":
"qwen3_omni"); benchmarks.qwen3_omni_gpu's report and plot read it from their --out.

GPU command (one H200, kind nvidia-h200, carry [".gpu/peer1"]: vllm-omni installed into
/tmp/peer-site from benchmarks/peer/wheels.txt's wheels, built by scripts/gpu/build_wheels.sh):
  export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn \
         HF_HUB_OFFLINE=1 VLLM_MM_HASHER_ALGORITHM=sha256
  (test -d /tmp/peer-site/vllm_omni || (mkdir -p /tmp/peer-whl && cat .gpu/peer1/peerpart* | tar x -C /tmp/peer-whl \
     && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-site /tmp/peer-whl/*.whl))
  python3 -m benchmarks.peer_vllm_omni --family qwen3_omni --deadline-s 550 --out $OUT/qwen3_omni_gpu
  (levels 1 8 32 64, 2500-id prompts, 200 thinker tokens, 200 frames. If one call's 10 minutes do
  not hold the cold start and all four levels, split it: --part a --concurrency 1,8,32 and
  --part b --concurrency 64; the report merges the parts. To show it beside omni_mp, put the
  fetched files in one dir with benchmarks.qwen3_omni_gpu's and run: python -m benchmarks.qwen3_omni_gpu
  --phases '' --out DIR.)
CPU check of the Qwen3-Omni path (fails at vllm-omni's first stage, as below; the tiny
checkpoint's dir, the overlay, the prompts and the sampling parameters are exercised):
  PYTHONPATH=$PWD python -m benchmarks.peer_vllm_omni --family qwen3_omni --smoke --peer-site /tmp/peer-site \
      --out /tmp/peer3_smoke

Isolation: vllm-omni registers a vLLM plugin that patches vLLM classes. It is never installed in
the project's environment: install it into a directory of its own (`pip install --no-deps
--target DIR`, benchmarks/peer/wheels.txt) and give that as --peer-site: only the child process
that runs vllm-omni gets DIR on its PYTHONPATH (benchmarks.omni_gpu sets VLLM_PLUGINS to an empty value,
which loads no plugin, for omni_mp's runs).

The parent process (this script) needs no vllm-omni: it builds the model dir, renders the
overlay next to a copy of the installed base YAML, runs the measurement in a child process
(`--child`, its own session, killed with its stage processes at --deadline-s), and writes the
result file (merging what the child wrote before a timeout). GPU commands: docs/benchmarks/ (each family's page).
CPU check (vllm-omni has no CPU platform: the run fails at its first stage and the file records
that error; the model dir, overlay resolution and sampling parameters are exercised):
  PYTHONPATH=$PWD python -m benchmarks.peer_vllm_omni --smoke --peer-site /tmp/peer-site --out /tmp/peer_smoke
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common.checkpoints import (
    QWEN2_5_CODEC_IDS,
    QWEN2_5_SAMPLES_PER_CODE,
    QWEN3_SAMPLES_PER_FRAME,
    qwen2_5_omni_dir,
    qwen3_omni_processor_dir,
)
from benchmarks.common.peer_site import child_env, copy_overlays, installed_version
from benchmarks.common.phases import REPO, module_cmd
from benchmarks.common.report import make_say
from benchmarks.common.rounds import SAMPLE_RATE, chat_prompts, closed_loop, token_prompts
from benchmarks.common.stats import percentile
from benchmarks.common.warmup import Warmups, warmup_seed

HERE = Path(__file__).resolve().parent
say = make_say("peer_vllm_omni")
CONFIGS = {"shipped": "qwen2_5_omni_1gpu.yaml", "seqs64": "qwen2_5_omni_1gpu_seqs64.yaml"}
BASE_YAML = "qwen2_5_omni.yaml"  # vllm-omni's shipped deploy config, in its package's deploy/
FIELDS = ("wall_s", "first_audio_p50_s", "first_audio_p90_s", "rtf_mean", "audio_s_per_s", "thinker_tok_s")
AUDIO_KEYS = ("audio", "model_outputs", "waveform", "wav")
# What vllm-omni's Qwen2.5-Omni run imports in its stage processes (checked before it starts).
PREFLIGHT = (
    "vllm_omni.entrypoints.async_omni",
    "vllm_omni.model_executor.models.qwen2_5_omni.qwen2_5_omni",
    "vllm_omni.model_executor.models.qwen2_5_omni.qwen2_5_omni_thinker",
    "vllm_omni.model_executor.models.qwen2_5_omni.qwen2_5_omni_talker",
    "vllm_omni.model_executor.models.qwen2_5_omni.qwen2_5_omni_token2wav",
    "vllm_omni.model_executor.stage_input_processors.qwen2_5_omni",
    "vllm_omni.worker.gpu_ar_worker",
    "vllm_omni.worker.gpu_generation_worker",
    "vllm_omni.diffusion.data",
)
RATE_KEYS = ("sr", "sample_rate", "audio_sample_rate", "sampling_rate")
QWEN3_PREFLIGHT = (
    "vllm_omni.entrypoints.async_omni",
    "vllm_omni.model_executor.models.qwen3_omni.pipeline",
    "vllm_omni.model_executor.models.qwen3_omni.qwen3_omni",
    "vllm_omni.model_executor.models.qwen3_omni.qwen3_omni_moe_thinker",
    "vllm_omni.model_executor.models.qwen3_omni.qwen3_omni_moe_talker",
    "vllm_omni.model_executor.models.qwen3_omni.qwen3_omni_code2wav",
    "vllm_omni.model_executor.stage_input_processors.qwen3_omni",
    "vllm_omni.distributed.omni_connectors.connectors.shm_connector",
    "vllm_omni.worker.gpu_ar_worker",
    "vllm_omni.worker.gpu_generation_worker",
)


@dataclass(frozen=True)
class Family:
    """What differs between the Qwen2.5-Omni and the Qwen3-Omni runs."""

    configs: dict[str, str]  # --config -> overlay in benchmarks/peer/
    base_yaml: str  # vllm-omni's shipped deploy config that the overlays build on
    preflight: tuple[str, ...]  # modules its run imports in its stage processes
    samples_per_code: int  # audio samples per talker code (Qwen2.5) or frame (Qwen3), 24 kHz
    streams: bool  # audio in chunks (DELTA outputs, summed) or in one final tensor
    prefix: str  # result files: <prefix><config>[.<part>].json
    work_dir: str  # under the temp dir: where the omni_mp benchmark builds the same model dir
    gpu: dict[str, Any] = field(default_factory=dict)  # default lengths and levels
    smoke: dict[str, Any] = field(default_factory=dict)


FAMILIES = {
    "qwen2_5_omni": Family(
        CONFIGS, BASE_YAML, PREFLIGHT, QWEN2_5_SAMPLES_PER_CODE, False, "vllm_omni_", "omni_gpu-models",
        gpu={"concurrency": [1, 8, 32, 64], "thinker_tokens": 128, "talker_codes": 200, "prompt_len": 64},
        smoke={"concurrency": [1, 2], "thinker_tokens": 8, "talker_codes": 36, "prompt_len": 16},
    ),
    "qwen3_omni": Family(
        {"shipped": "qwen3_omni_1gpu.yaml"}, "qwen3_omni_moe.yaml", QWEN3_PREFLIGHT, QWEN3_SAMPLES_PER_FRAME, True,
        "vllm_omni_qwen3_omni_", "qwen3_omni_gpu",
        # benchmarks.qwen3_omni_gpu's lengths (its parse_args: the published 2500-id prompts; --smoke its small ones)
        gpu={"concurrency": [1, 8, 32, 64], "thinker_tokens": 200, "talker_codes": 200, "prompt_len": 2500},
        smoke={"concurrency": [1, 4], "thinker_tokens": 12, "talker_codes": 16, "prompt_len": 48},
    ),
}  # fmt: skip


def result_path(out: Path, config: str, part: str | None = None, family: str = "qwen2_5_omni") -> Path:
    return out / f"{FAMILIES[family].prefix}{config}{'.' + part if part else ''}.json"


def out_file(args: argparse.Namespace) -> Path:
    return result_path(args.out, args.config, args.part, args.family)


# ---- parent: model dir, overlay, child process -------------------------------------------------
def render_overlay(
    config: str, peer_site: Path, run_dir: Path, family: str = "qwen2_5_omni"
) -> tuple[Path, dict[str, str]]:
    """Our overlay chain and the installed base YAML, copied into run_dir (base_config paths are
    resolved next to the overlay); returns the overlay to load and each file's sha256."""
    fam = FAMILIES[family]
    shas = copy_overlays(fam.base_yaml, list(fam.configs.values()), peer_site, run_dir)
    return run_dir / fam.configs[config], shas


def model_dir(args: argparse.Namespace) -> Path:
    """The omni_mp benchmark's model dir of the family, with what vllm-omni also loads (its
    tokenizer and the thinker's processor)."""
    if args.family == "qwen2_5_omni":
        return qwen2_5_omni_dir(args.work_dir, args.smoke, args.talker)
    return qwen3_omni_processor_dir(args.work_dir, args.smoke)


def prompts(args: argparse.Namespace, model: Path, n: int, seed: int) -> list[list[int]]:
    """The omni_mp benchmark's prompts for `n` requests with `seed`."""
    if args.family == "qwen2_5_omni":
        return token_prompts(n, args.prompt_len, seed)
    return chat_prompts(json.loads((model / "config.json").read_text()), n, args.prompt_len, seed)


def run(args: argparse.Namespace) -> dict[str, Any]:
    path = out_file(args)
    units = "talker_codes" if args.family == "qwen2_5_omni" else "talker_frames"
    doc: dict[str, Any] = {
        "system": f"vllm-omni {installed_version(args.peer_site)}",
        "family": args.family,
        "config": args.config,
        "overlay": f"benchmarks/peer/{FAMILIES[args.family].configs[args.config]}",
        "lengths": {
            "prompt_len": args.prompt_len, "thinker_tokens": args.thinker_tokens, units: args.talker_codes,
            "audio_s": expected_audio_s(args),
        },
        "concurrency": args.concurrency,
        "device": device_name(),
    }  # fmt: skip
    t0 = time.perf_counter()
    try:
        model = model_dir(args)
        doc["model_dir"] = str(model)
        doc["sizes"] = model_sizes(model)
        run_dir = args.out / f"peer-{FAMILIES[args.family].prefix.removeprefix('vllm_omni_')}{args.config}"
        overlay, doc["yaml_sha256"] = render_overlay(args.config, args.peer_site, run_dir, args.family)
        doc["prompt_head"] = prompts(args, model, 1, 1)[0][:8]  # the prompt builder, run before any stage starts
    except Exception as err:  # noqa: BLE001 - written to the result file
        doc["error"] = f"setup: {type(err).__name__}: {err}"
        path.write_text(json.dumps(doc, indent=1))
        say(doc["error"])
        return doc
    partial = args.out / f".{path.stem}.partial.json"
    partial.unlink(missing_ok=True)
    cmd = module_cmd("benchmarks.peer_vllm_omni", "--child", str(overlay), "--model", str(model))
    cmd += ["--partial", str(partial), *sys.argv[1:]]
    timeout = args.deadline_s - (time.perf_counter() - t0) if args.deadline_s else None
    log = path.with_suffix(".log")
    say(f"{doc['system']}, config {args.config} ({overlay.name}), levels {args.concurrency}; log: {log}")
    with open(log, "w") as logf:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=child_env(args.peer_site), stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the stage processes go with it
        )  # fmt: skip
        code: int | str
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = f"killed at --deadline-s {args.deadline_s:.0f} s"
            end_group(proc.pid)
            proc.wait()
    end_group(proc.pid)  # whatever the child left of its group (vllm-omni's stage processes)
    if partial.exists():
        doc.update(json.loads(partial.read_text()))
        partial.unlink()
    if code != 0 and "error" not in doc:
        doc["error"] = f"child exit {code}; last log lines: {tail(log, 15)}"
    doc["run_s"] = time.perf_counter() - t0
    path.write_text(json.dumps(doc, indent=1))
    say(f"wrote {path}" + (f" (FAILED: {doc['error'][:300]})" if "error" in doc else ""))
    return doc


def device_name() -> str:
    """The device's name (phases.device_name), taken in a short-lived process: no CUDA context is
    held in this one (its GPU memory would stay taken while vllm-omni runs) or made before
    vllm-omni starts."""
    code = "from benchmarks.common.phases import device_name; print(device_name())"
    got = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    return got.stdout.strip().splitlines()[-1] if got.returncode == 0 and got.stdout.strip() else "unknown device"


def end_group(pgid: int, grace_s: float = 20.0) -> None:
    """SIGTERM to every process of the group, SIGKILL to what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        t_end = time.monotonic() + grace_s
        while time.monotonic() < t_end:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def tail(path: Path, n: int) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-3000:]


def model_sizes(model: Path) -> dict[str, Any]:
    cfg = json.loads((model / "config.json").read_text())
    text = cfg["thinker_config"]["text_config"]
    talker = cfg["talker_config"].get("text_config", cfg["talker_config"])  # Qwen3-Omni nests it
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    return {
        "thinker": {k: text.get(k) for k in (*keys, "vocab_size", "num_experts")},
        "talker": {k: talker.get(k) for k in (*keys, "head_dim", "vocab_size", "embedding_size", "num_experts")},
    }


def expected_audio_s(args: argparse.Namespace) -> float:
    return args.talker_codes * FAMILIES[args.family].samples_per_code / SAMPLE_RATE


# ---- child: vllm-omni in this process ----------------------------------------------------------
TALKER_VOCAB = 8448  # the released talker's codec vocabulary (model_sizes reads it from config.json)


def talker_overrides(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """The talker's fixed length, and its codec control ids suppressed through logit_bias: vLLM
    sized an `allowed_token_ids` mask by the checkpoint's top-level vocab (the thinker's 152064)
    while vllm-omni's Qwen2.5 talker logits are 8448 wide, which failed every request on an H200
    (2026-11-24: "expanded size of the tensor (8448) must match ... (152064)"); a bias indexes
    the logits by id, whatever width vLLM takes the vocab to be."""
    if args.family == "qwen2_5_omni":
        tokens, first, vocab = args.talker_codes, QWEN2_5_CODEC_IDS, TALKER_VOCAB
    else:
        # Qwen3-Omni: a talker step feeds back the last sampled code and runs the code predictor
        # on it; the last sampled code makes no frame, so frames + 1 tokens (omni_mp's talker
        # does the same). Control ids: the codebook's top (2048) up to the talker vocab (3072);
        # min_tokens also masks the pipeline's stop id (codec eos 2150) until the last token.
        talker = json.loads((model / "config.json").read_text())["talker_config"]
        tokens = args.talker_codes + 1
        first, vocab = talker["code_predictor_config"]["vocab_size"], talker["text_config"]["vocab_size"]
    return {
        "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
        "logit_bias": {i: -100.0 for i in range(first, vocab)},
    }  # fmt: skip


def sampling_params_list(defaults: list[Any], args: argparse.Namespace, model: Path) -> list[Any]:
    """The deploy config's per-stage defaults (its sampling constraints included) with the fixed
    lengths and the talker's control ids suppressed; the thinker's and talker's outputs
    final-only, the audio stage's final-only (Qwen2.5: one tensor) or DELTA (Qwen3: each chunk
    as it is decoded, as vllm-omni's streaming server asks for it)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    overrides: dict[int, dict[str, Any]] = {
        0: {"max_tokens": args.thinker_tokens, "min_tokens": args.thinker_tokens, "ignore_eos": True},
        1: talker_overrides(args, model),
    }
    streams = FAMILIES[args.family].streams
    out = []
    for i, sp in enumerate(defaults):
        if not isinstance(sp, SamplingParams):  # a stage that is not an LLM: as configured
            out.append(copy.deepcopy(sp))
            continue
        fields = {f: copy.deepcopy(getattr(sp, f)) for f in sp.__struct_fields__ if not f.startswith("_")}
        fields.update(overrides.get(i, {}))
        audio_stage = i == len(defaults) - 1
        fields["output_kind"] = RequestOutputKind.DELTA if streams and audio_stage else RequestOutputKind.FINAL_ONLY
        out.append(SamplingParams(**fields))  # built anew: derived fields (stop ids) recomputed
    return out


def sampling_summary(sp: Any) -> dict[str, Any] | str:
    """What a stage's SamplingParams fix (its repr leaves out the bias and the output kind)."""
    if not hasattr(sp, "max_tokens"):
        return repr(sp)[:400]
    keys = ("max_tokens", "min_tokens", "ignore_eos", "temperature", "top_k", "top_p", "repetition_penalty", "seed")
    out: dict[str, Any] = {k: getattr(sp, k) for k in keys}
    out["stop_token_ids"] = list(sp.stop_token_ids or [])
    out["output_kind"] = sp.output_kind.name
    bias = sp.logit_bias or {}
    out["logit_bias"] = f"{len(bias)} ids {min(bias)}..{max(bias)}: {set(bias.values())}" if bias else None
    return out


def planned_defaults(overlay: Path, model: Path) -> list[Any]:
    """Each stage's default SamplingParams as vllm-omni's own config merge makes them from the
    overlay chain and the pipeline's sampling constraints, without starting a stage: the
    sampling parameters of a run are built (and recorded) even where no stage can start."""
    from transformers import AutoConfig
    from vllm.sampling_params import SamplingParams
    from vllm_omni.config.config_factory import StageConfigFactory
    from vllm_omni.config.stage_config import load_deploy_config, merge_pipeline_deploy

    hf = AutoConfig.from_pretrained(model)
    pipeline = StageConfigFactory.resolve_pipeline_config(hf.model_type, hf)
    stages = merge_pipeline_deploy(pipeline, load_deploy_config(overlay))
    return [SamplingParams(**s.yaml_extras.get("default_sampling_params", {})) for s in stages]


def audio_of(mm: Any) -> tuple[int, int | None, str]:
    """(samples, sample rate or None, what was found) of one output's multimodal payload."""
    import torch

    def numel(x: Any) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel()
        if isinstance(x, (list, tuple)):
            return sum(numel(v) for v in x)
        return int(getattr(x, "size", 0) or 0)  # numpy

    if mm is None:
        return 0, None, "none"
    if hasattr(mm, "to_dict"):  # vllm-omni's MultimodalPayload: tensors and metadata
        items = mm.to_dict()
    else:
        items = dict(mm.items()) if hasattr(mm, "items") else {"audio": mm}
    rate = None
    for k in RATE_KEYS:
        if k in items and items[k] is not None:
            v = items[k]
            v = v.flatten()[0].item() if isinstance(v, torch.Tensor) else v
            rate = int(v[0] if isinstance(v, (list, tuple)) else v)
            break
    for k in AUDIO_KEYS:
        if k in items and items[k] is not None:
            v = items[k]
            shapes = [tuple(t.shape) for t in (v if isinstance(v, (list, tuple)) else [v]) if hasattr(t, "shape")]
            return numel(v), rate, f"{k} ({type(v).__name__}, shapes {shapes[:4]}); keys {sorted(items)}"
    return 0, rate, f"no audio key; keys {sorted(items)}"


async def one_request(
    omni: Any, prompt: list[int], rid: str, sps: list[Any], t0: float, streams: bool
) -> dict[str, Any]:
    """One generate(): first audio = the first audio output with samples to reach this caller;
    a request's audio = the last audio output's (final-only, the whole audio) or, with `streams`
    (DELTA outputs: each the audio decoded since the previous), their sum."""
    first, last, samples, rate, thinker_tokens, found, n_audio = None, None, 0, None, None, "", 0
    gen = omni.generate(
        {"prompt_token_ids": prompt}, request_id=rid, sampling_params_list=sps, output_modalities=["text", "audio"]
    )
    async for out in gen:
        now = time.perf_counter()
        if getattr(out, "error", None):
            raise RuntimeError(f"request {rid}: stage {out.stage_id}: {out.error}")
        completions = getattr(out.request_output, "outputs", None)
        if out.stage_id == 0 and completions:  # the thinker's text output (final-only: all its tokens)
            thinker_tokens = len(completions[0].token_ids)
        if out.final_output_type == "audio":
            n, r, found = audio_of(out.multimodal_output)
            if n:
                n_audio += 1
                first = now if first is None else first
                last, samples, rate = now, samples + n if streams else n, r or rate
    done = time.perf_counter()
    if first is None:
        raise RuntimeError(f"request {rid}: no audio output ({found or 'no audio-type output'})")
    rate = rate or SAMPLE_RATE
    return {
        "first_s": first - t0, "last_audio_s": last - t0, "done_s": done - t0, "audio_s": samples / rate,
        "sample_rate": rate, "thinker_tokens": thinker_tokens, "audio_outputs": n_audio, "found": found,
    }  # fmt: skip


def check_round(batch: list[list[int]], reqs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Distinct prompts, every request's thinker token count exact and every request's audio as
    long as every other's: what makes requests and systems comparable. The audio length against
    omni_mp's (codes x 480 / frames x 1920 samples) is exact unless --audio-tolerance allows a
    vllm-omni that trims a few samples (never more audio: a round with more fails too; the
    difference is written into the result and the report)."""
    if len({tuple(p) for p in batch}) != len(batch):
        raise RuntimeError("prompts of a round are not distinct")
    audio_s = expected_audio_s(args)
    lengths = sorted({round(r["audio_s"], 6) for r in reqs})
    bad = [
        r
        for r in reqs
        if not audio_s - args.audio_tolerance * audio_s - 1e-6 <= r["audio_s"] <= audio_s + 1e-6
        or r["thinker_tokens"] != args.thinker_tokens
    ]
    if bad or len(lengths) > 1:
        b = (bad or reqs)[0]
        raise RuntimeError(
            f"{len(bad)} of {len(reqs)} requests differ from the fixed lengths ({args.thinker_tokens} thinker tokens, "
            f"{audio_s:.4f} s of audio), e.g. {b['thinker_tokens']} tokens, {b['audio_s']:.4f} s "
            f"at {b['sample_rate']} Hz in {b['audio_outputs']} audio output(s), {b['found']}; "
            f"audio lengths in the round: {lengths[:5]} s"
        )


def summarize(batch: list[list[int]], reqs: list[dict[str, Any]], wall: float, args: argparse.Namespace) -> dict:
    """omni_gpu's stream-phase fields for one round (first audio = the audio output's arrival)."""
    check_round(batch, reqs, args)
    firsts = [r["first_s"] for r in reqs]
    audio = sum(r["audio_s"] for r in reqs)
    return {
        "requests": len(reqs),
        "wall_s": wall,
        "first_audio_p50_s": statistics.median(firsts),
        "first_audio_mean_s": statistics.fmean(firsts),
        "first_audio_p90_s": percentile(firsts, 0.9),
        "rtf_mean": statistics.fmean(r["last_audio_s"] / r["audio_s"] for r in reqs),
        "audio_s_per_s": audio / wall,
        "thinker_tok_s": sum(r["thinker_tokens"] for r in reqs) / wall,
        "audio_s_per_request": audio / len(reqs),
        "audio_s_expected": expected_audio_s(args),
        "done_p50_s": statistics.median(r["done_s"] for r in reqs),
        "audio_outputs_per_request": max(r["audio_outputs"] for r in reqs),
    }


async def a_round(omni: Any, batch: list[list[int]], sps: list[Any], tag: str, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    streams = FAMILIES[args.family].streams
    got = await asyncio.gather(
        *(one_request(omni, p, f"{tag}-{i}", sps, t0, streams) for i, p in enumerate(batch)), return_exceptions=True
    )  # every request ends before the round does (a failed one must not leak into the next level)
    errors = [g for g in got if isinstance(g, BaseException)]
    if errors:
        raise RuntimeError(
            f"{len(errors)} of {len(batch)} requests failed, first: {type(errors[0]).__name__}: {errors[0]}"
        )
    reqs = [g for g in got if not isinstance(g, BaseException)]
    out = summarize(batch, reqs, time.perf_counter() - t0, args)
    out["audio_payload"] = reqs[0]["found"]
    return out


async def closed_loop_level(omni: Any, sps: list[Any], c: int, args: argparse.Namespace) -> dict[str, Any]:
    """--closed-loop x c requests, c in flight (rounds.closed_loop; the omni_mp benchmarks'
    closed-loop prompts: seed 5000 x c), checked and summarized like a round."""
    batch = prompts(args, args.model, args.closed_loop * c, 5000 * c)
    streams = FAMILIES[args.family].streams
    ids = iter(range(len(batch)))

    async def one(prompt: list[int], t0: float) -> dict[str, Any]:
        return await one_request(omni, prompt, f"closed{c}-{next(ids)}", sps, t0, streams)

    reqs, wall = await closed_loop(one, batch, c)
    return {**summarize(batch, reqs, wall, args), "concurrency": c}


def max_num_seqs(overlay: Path) -> int:
    from vllm_omni.config.stage_config import load_deploy_config

    return max(s.max_num_seqs or 1 for s in load_deploy_config(overlay).stages)


PEER_WARMUP = (
    "one unmeasured round at each level just before its measured rounds (the level's requests, at most as many "
    "as the stages batch)"
)


def child(args: argparse.Namespace) -> int:
    """vllm-omni in this process; what is measured goes to --partial after every step."""
    res: dict[str, Any] = {}  # no CUDA in this process before vllm-omni starts its stages

    def save() -> None:
        args.partial.write_text(json.dumps(res, indent=1, default=str))

    try:
        asyncio.run(serve_and_measure(args, res, save))
    except Exception as err:  # noqa: BLE001 - the run failed: its error is the result
        import traceback

        res["error"] = f"{type(err).__name__}: {err}"[:2000]
        res["traceback"] = traceback.format_exc()[-4000:]
        cause = err.__cause__ or err.__context__
        if cause is not None:
            where = traceback.extract_tb(cause.__traceback__)[-1:] if cause.__traceback__ else []
            at = (
                f" at {where[0].filename.split('site-packages/')[-1]}:{where[0].lineno} ({where[0].name})"
                if where
                else ""
            )
            res["error"] += f" (caused by {type(cause).__name__}: {cause}{at})"[:1000]
        save()
        say(f"FAILED: {res['error']}")
        return 1
    return 0


async def serve_and_measure(args: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    """Start vllm-omni (its preflight imports first), then its levels and closed loops."""
    import importlib

    for mod in FAMILIES[args.family].preflight:  # a missing wheel fails here in seconds, not after a stage start
        try:
            importlib.import_module(mod)
        except Exception as err:
            raise RuntimeError(f"preflight: importing {mod}: {type(err).__name__}: {err}") from err
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    res["max_num_seqs"] = max_num_seqs(args.child)
    planned = sampling_params_list(planned_defaults(args.child, args.model), args, args.model)
    res["sampling_planned"] = [sampling_summary(s) for s in planned]  # recorded before any stage starts
    save()
    t0 = time.perf_counter()
    omni = AsyncOmni(model=str(args.model), deploy_config=str(args.child), stage_init_timeout=1500, init_timeout=1500)
    res["cold_start_s"] = time.perf_counter() - t0
    say(f"ready in {res['cold_start_s']:.1f}s")
    save()
    try:
        sps = sampling_params_list(omni.default_sampling_params_list, args, args.model)
        res["sampling"] = [sampling_summary(s) for s in sps]
        await measure_levels(omni, sps, args, res, save)
        await closed_loops(omni, sps, args, res, save)
    finally:
        omni.shutdown()


async def measure_levels(omni: Any, sps: list[Any], args: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    """Per level, in order: one unmeasured warm-up round (first runs of the level's batch sizes,
    allocator growth; no more requests than the stages batch: at max_num_seqs 1, 2 requests
    already overlap all stages, more would only queue), then --rounds measured rounds, the best
    kept in res[level]. A level that fails is recorded in res["errors"] and the run goes on.
    --rounds 0: only the first level's warm-up (a check that the peer serves)."""
    warmups = Warmups(PEER_WARMUP)
    for c in args.concurrency if args.rounds else args.concurrency[:1]:
        n = min(c, max(2, res["max_num_seqs"]))
        t0 = time.time()
        try:
            warm = await a_round(omni, prompts(args, args.model, n, warmup_seed(c)), sps, f"warm{c}", args)
        except Exception as err:  # noqa: BLE001 - recorded per level, the run goes on
            res.setdefault("errors", {})[str(c)] = f"warm-up: {type(err).__name__}: {err}"[:2000]
            say(f"c={c} warm-up FAILED: {res['errors'][str(c)]}")
            save()
            continue
        warmups.warmed(c, t0, n, audio_payload=warm["audio_payload"])
        res["warmup"] = warmups.to_json()
        say(f"c={c}: warm-up round of {n}: {warm['wall_s']:.1f}s; audio payload: {warm['audio_payload']}")
        runs = []
        for r in range(args.rounds):
            batch = prompts(args, args.model, c, 1000 * c + r)  # the omni_mp benchmark's seeds
            t_round = time.time()
            try:
                runs.append(await a_round(omni, batch, sps, f"c{c}r{r}", args))
            except Exception as err:  # noqa: BLE001 - recorded per level, the run goes on
                res.setdefault("errors", {})[str(c)] = f"{type(err).__name__}: {err}"[:2000]
                say(f"c={c} FAILED: {res['errors'][str(c)]}")
                break
            warmups.measured(c, t_round)
        res["warmup"] = warmups.to_json()
        if runs:
            best = res[str(c)] = min(runs, key=lambda x: x["wall_s"])
            say(
                f"c={c}: first audio p50 {best['first_audio_p50_s'] * 1000:.0f} ms, "
                f"p90 {best['first_audio_p90_s'] * 1000:.0f} ms, RTF {best['rtf_mean']:.3f}, "
                f"{best['audio_s_per_s']:.2f} audio s/s, {best['thinker_tok_s']:.0f} thinker tok/s"
            )
        save()


async def closed_loops(omni: Any, sps: list[Any], args: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    """After the rounds, per level c > 1 (warmed up by its rounds): --closed-loop x c requests
    with c in flight (`closed_loop_level`); a failed one is recorded and the run goes on."""
    for c in (c for c in args.concurrency if c > 1 and args.closed_loop):
        try:
            res.setdefault("closed", {})[str(c)] = await closed_loop_level(omni, sps, c, args)
        except Exception as err:  # noqa: BLE001 - recorded per level, the run goes on
            res.setdefault("errors", {})[f"closed {c}"] = f"{type(err).__name__}: {err}"[:2000]
            say(f"closed loop c={c} FAILED: {res['errors'][f'closed {c}']}")
        else:
            r = res["closed"][str(c)]
            say(
                f"closed loop c={c}, {r['requests']} requests: first audio mean "
                f"{r['first_audio_mean_s'] * 1000:.0f} ms, p50 {r['first_audio_p50_s'] * 1000:.0f} ms, "
                f"RTF {r['rtf_mean']:.3f}, {r['audio_s_per_s']:.2f} audio s/s"
            )
        save()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="qwen2_5_omni", help="which model's pipeline")
    p.add_argument("--config", default="shipped", help="of the family's overlays (FAMILIES[family].configs)")
    p.add_argument("--part", help="write vllm_omni_<config>.<part>.json: levels of one config run in several calls")
    p.add_argument("--peer-site", type=Path, default=Path("/tmp/peer-site"), help="where vllm-omni is installed")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--thinker-tokens", type=int, default=None, help="default: the family's (128 / 200)")
    p.add_argument(
        "--talker-codes",
        "--talker-frames",
        dest="talker_codes",
        type=int,
        default=None,
        help="talker codes (Qwen2.5: 50 = 1 s) or frames (Qwen3: 12.5 = 1 s) per request; default 200",
    )
    p.add_argument("--prompt-len", type=int, default=None, help="default: the family's (64 / 2500)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measured rounds per level (after its warm-up round); best kept; 0: only the first level's warm-up",
    )
    p.add_argument(
        "--closed-loop",
        type=int,
        default=0,
        metavar="X",
        help="after the rounds, per level c > 1: X x c requests with c in flight (as in benchmarks.qwen3_omni_gpu); "
        "0: off",
    )
    p.add_argument(
        "--audio-tolerance",
        type=float,
        default=None,
        help="relative shortfall allowed of a request's audio against codes x 480 / frames x 1920 samples "
        "(default: Qwen2.5 0, exact; Qwen3 just under one frame, the tail vllm-omni's decoder leaves off)",
    )
    p.add_argument("--talker", choices=["released", "default"], default="released", help="as benchmarks.omni_gpu's")
    p.add_argument("--smoke", action="store_true", help="the tiny model dirs of the omni_mp benchmarks' --smoke")
    p.add_argument("--work-dir", type=Path, default=None, help="default: the omni_mp benchmark's, same model dir")
    p.add_argument("--out", type=Path, default=None, help="default: outputs/omni_gpu or outputs/qwen3_omni_gpu")
    p.add_argument("--deadline-s", type=float, help="the child (and its stages) is killed after this; results kept")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # the rendered overlay
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--partial", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    fam = FAMILIES[args.family]
    if args.config not in fam.configs:
        p.error(f"--config {args.config}: {args.family} has {sorted(fam.configs)}")
    for attr, value in (fam.smoke if args.smoke else fam.gpu).items():
        if getattr(args, attr) is None:
            setattr(args, attr, value)
    if args.audio_tolerance is None:  # Qwen3: less than one frame short, never longer
        one_frame = (fam.samples_per_code - 1) / (args.talker_codes * fam.samples_per_code)
        args.audio_tolerance = one_frame if fam.streams else 0.0
    args.work_dir = args.work_dir or Path(tempfile.gettempdir()) / fam.work_dir
    args.out = args.out or REPO / "outputs" / ("omni_gpu" if args.family == "qwen2_5_omni" else "qwen3_omni_gpu")
    return args


def main() -> int:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        return child(args)
    args.out.mkdir(parents=True, exist_ok=True)
    return 0 if "error" not in run(args) and not run_errors(args) else 1


def run_errors(args: argparse.Namespace) -> dict[str, str]:
    return json.loads(out_file(args).read_text()).get("errors", {})


if __name__ == "__main__":
    sys.exit(main())

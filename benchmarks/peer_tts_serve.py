"""vllm-omni 0.25.0rc1 serving Qwen3-TTS over HTTP on the checkpoint dir omni_mp's GPU run serves
(benchmarks.tts_serving --write-released), so that benchmarks.tts_serving --serving measures both
servers with the same client, sentences, lengths and rates (issue 50 item 4; scripts/gpu/tts_peer.sh).

Its server: `vllm serve DIR --omni --deploy-config YAML` (vllm_omni.entrypoints.cli.main), its
pipeline chosen by the dir's config.json (model_type qwen3_tts: talker -> code2wav), the deploy
config benchmarks/peer/qwen3_tts_1gpu.yaml over the installed deploy/qwen3_tts.yaml (every change
and its reason is in that file), served as model name "tts" (the name tts_serving sends). Its
`/v1/audio/speech` takes the fields tts_serving sends ours (model, input, voice, response_format
pcm, max_new_tokens -> the talker's max_tokens) and streams raw PCM chunks as code2wav decodes
them with `stream_format: "audio"` (ours streams either way).

Isolation as in benchmarks.peer_vllm_omni: vllm-omni lives in --peer-site (never in the project's
environment) and only the server's process gets it on PYTHONPATH (child_env). The parent renders
the overlay next to a copy of the installed base YAML, checks the dir (the EOS id the overlay
suppresses, the voice, the files vllm-omni reads), runs a preflight import of the server and the
pipeline's modules in a child (a missing wheel is named before the minutes of a start), then
replaces itself with the server (exec: the caller's pid is the server's, stopped with SIGINT).

    python -m benchmarks.peer_tts_serve --model DIR --port 8091 [--peer-site /tmp/peer-site]
    python -m benchmarks.peer_tts_serve --model DIR --dry-run   (CPU check: the overlay as vllm-omni
        resolves it, the talker's SamplingParams and the command; nothing served)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common.peer_site import child_env, copy_overlays, installed_version
from benchmarks.common.report import make_say

say = make_say("peer_tts_serve")
BASE_YAML = "qwen3_tts.yaml"  # vllm-omni's shipped deploy config, in its package's deploy/
OVERLAY = "qwen3_tts_1gpu.yaml"  # benchmarks/peer/
SERVED_NAME = "tts"  # benchmarks.tts_serving's request `model`
SUPPRESSED_EOS = 2150  # the overlay's logit_bias key: the released codec_eos_token_id
VOICE = "vivian"  # scripts/gpu/tts_benchmark.sh's --voice
# What its server and this pipeline import (checked in a child before it starts)
PREFLIGHT = (
    "vllm_omni.entrypoints.cli.main",
    "vllm_omni.entrypoints.cli.serve",
    "vllm_omni.entrypoints.openai.api_server",
    "vllm_omni.entrypoints.openai.serving_speech",
    "vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker",
    "vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code2wav",
    "vllm_omni.model_executor.stage_input_processors.qwen3_tts",
    "vllm_omni.distributed.omni_connectors.connectors.shm_connector",
    "vllm_omni.worker.gpu_ar_worker",
    "vllm_omni.worker.gpu_generation_worker",
)
# The overlay as vllm-omni resolves it, and the talker's sampling defaults as its stage builds them
RESOLVE = (
    "import json, sys\n"
    "from vllm import SamplingParams\n"
    "from vllm_omni.config.stage_config import load_deploy_config\n"
    "d = load_deploy_config(sys.argv[1])\n"
    "sp = SamplingParams(**d.stages[0].default_sampling_params)\n"
    "print(json.dumps({'async_chunk': d.async_chunk, 'stages': [[s.stage_id, s.devices, s.gpu_memory_utilization,"
    " s.max_num_seqs, s.load_format] for s in d.stages], 'talker': {'logit_bias': sp.logit_bias,"
    " 'temperature': sp.temperature, 'top_k': sp.top_k, 'min_tokens': sp.min_tokens,"
    " 'repetition_penalty': sp.repetition_penalty}}))\n"
)


def check_model(model: Path) -> None:
    """The dir is the one the overlay was written for: its codec EOS is the suppressed id, the
    voice is a preset, and the files vllm-omni reads beside ours are there."""
    talker = json.loads((model / "config.json").read_text())["talker_config"]
    if int(talker["codec_eos_token_id"]) != SUPPRESSED_EOS:
        raise SystemExit(f"codec_eos_token_id {talker['codec_eos_token_id']}: the overlay suppresses {SUPPRESSED_EOS}")
    if VOICE not in {name.lower() for name in talker["spk_id"]}:
        raise SystemExit(f"voice {VOICE!r} not among the dir's speakers {sorted(talker['spk_id'])}")
    for rel in ("speech_tokenizer/config.json", "speech_tokenizer/preprocessor_config.json"):
        if not (model / rel).is_file():
            raise SystemExit(f"{model / rel} missing: rewrite the dir with benchmarks.tts_serving --write-released")


def serve_cmd(model: Path, overlay: Path, host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "vllm_omni.entrypoints.cli.main", "serve", str(model), "--omni",
        "--deploy-config", str(overlay), "--served-model-name", SERVED_NAME, "--host", host, "--port", str(port),
    ]  # fmt: skip


def in_child(code: list[str], peer_site: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`python` with `code` (its argv) with vllm-omni on the path, output captured."""
    env = child_env(peer_site)
    return subprocess.run([sys.executable, *code], env=env, capture_output=True, text=True, timeout=timeout_s)


# Packages whose modules the server imports lazily (vLLM's build_app attaches its routers after
# the engines started: a missing `prometheus_fastapi_instrumentator` surfaced 5.5 min into a GPU
# call). Every module under these is imported up front; the gRPC server is not on the HTTP path.
PREFLIGHT_WALK = ("vllm.entrypoints", "vllm_omni.entrypoints")
PREFLIGHT_CODE = """
import importlib, pkgutil, sys
for m in sys.argv[2:]:
    importlib.import_module(m)
missing = {}
for pkg in sys.argv[1].split(","):
    for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
        if "grpc" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as err:
            missing.setdefault(err.name, info.name)
if missing:
    sys.exit("missing: " + ", ".join(f"{k} (for {v})" for k, v in sorted(missing.items())))
print("preflight ok")
"""


def preflight(peer_site: Path) -> None:
    """Every module of PREFLIGHT, and every module under PREFLIGHT_WALK, imports with vllm-omni on
    the path; else every missing package named (to add to benchmarks/peer/wheels.txt)."""
    run = in_child(["-c", PREFLIGHT_CODE, ",".join(PREFLIGHT_WALK), *PREFLIGHT], peer_site, 300)
    if run.returncode != 0:
        raise SystemExit(f"vllm-omni's server does not import: {run.stderr.strip().splitlines()[-1:]}")


def resolve(overlay: Path, peer_site: Path) -> dict[str, object]:
    run = in_child(["-c", RESOLVE, str(overlay)], peer_site, 300)
    if run.returncode != 0:
        raise SystemExit(f"the overlay does not resolve: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="the checkpoint dir (tts_serving --write-released's)")
    p.add_argument("--peer-site", type=Path, default=Path("/tmp/peer-site"), help="where vllm-omni is installed")
    p.add_argument("--run-dir", type=Path, default=Path("/tmp/peer-qwen3_tts"), help="the rendered overlay's dir")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--dry-run", action="store_true", help="resolve and print; serve nothing")
    args = p.parse_args(argv)
    check_model(args.model)
    shas = copy_overlays(BASE_YAML, [OVERLAY], args.peer_site, args.run_dir)
    overlay = args.run_dir / OVERLAY
    say(f"vllm-omni {installed_version(args.peer_site)}; deploy config {overlay} (sha256 {shas})")
    resolved = resolve(overlay, args.peer_site)
    say(f"resolved: {json.dumps(resolved)}")
    cmd = serve_cmd(args.model, overlay, args.host, args.port)
    say(f"command: {' '.join(cmd)}")
    if args.dry_run:
        return 0
    preflight(args.peer_site)
    os.execvpe(cmd[0], cmd, child_env(args.peer_site))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())

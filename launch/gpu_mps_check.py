"""GPU sharing check (omni_mp.control.mps, `gpu_sharing` in the pipeline YAML) on one GPU:

1. The tiny Qwen3-Omni pipeline (omni_mp/stage_configs/tiny_qwen3_omni.yaml, fp32, CUDA graphs, every
   stage on GPU 0) serves the same 8 concurrent requests time-sliced and under MPS: thinker
   tokens, frames and audio must agree (gpu_qwen3_omni_check's criteria). Under MPS the private
   daemon must list every stage process as its client while it serves.
2. After each shutdown: no MPS process (`nvidia-cuda-mps-*`) and no `omni-mps-*` directory left.
3. A process that started a daemon (omni_mp.control.mps.MpsDaemon, what the coordinator does)
   and has a CUDA client on it is SIGKILLed: the client ends with it here (as a stage does,
   by its parent-death signal), and the guard must quit the daemon and remove its directory.

    python launch/gpu_mps_check.py --out mps_check.json

Exit code 0 when all of it holds. On the lent GPU hosts, set VLLM_MM_HASHER_ALGORITHM=sha256.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.gpu_qwen3_omni_check import AUDIO_RTOL, REQUESTS, config, outputs, run  # noqa: E402
from omni_mp.config.validate import GpuSharingConfig  # noqa: E402
from omni_mp.control.mps import PIPE_ENV, MpsDaemon, control_program  # noqa: E402

MPS_PROCS = "nvidia-cuda-mps"  # the control daemon and its servers
CLEANUP_S = 60.0  # for the guard to quit the daemon once its coordinator is gone


def mps_leftovers() -> dict[str, list[Any]]:
    """MPS processes and our daemons' directories still on this host."""
    procs = [p.info for p in psutil.process_iter(["pid", "name"]) if (p.info["name"] or "").startswith(MPS_PROCS)]
    return {"processes": procs, "dirs": glob.glob(str(Path(tempfile.gettempdir()) / "omni-mps-*"))}


def wait_clean(timeout_s: float) -> dict[str, list[Any]]:
    deadline = time.monotonic() + timeout_s
    while (left := mps_leftovers())["processes"] or left["dirs"]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return left


def daemon_clients(pipe: str) -> list[int]:
    """PIDs of the clients of every server the daemon at `pipe` runs."""
    env = {**os.environ, PIPE_ENV: pipe}

    def ask(command: str) -> list[int]:
        out = subprocess.run([control_program()], input=command.encode(), env=env, capture_output=True, timeout=30)
        return [int(tok) for tok in out.stdout.split() if tok.isdigit()]

    return [pid for server in ask("get_server_list\n") for pid in ask(f"get_client_list {server}\n")]


def pipeline_round(mode: str) -> tuple[list[Any], float, dict[str, Any]]:
    cfg = msgspec.structs.replace(config("graphs", 1), gpu_sharing=GpuSharingConfig(mode=mode))  # type: ignore[arg-type]
    seen: dict[str, Any] = {}

    def inspect(coord: Any) -> None:
        stage_pids = sorted(h.pid for h in coord.stages.values())
        seen["stage_pids"] = stage_pids
        seen["daemon"] = coord.mps is not None
        if coord.mps is not None:
            clients = sorted(daemon_clients(coord.mps.pipe))
            seen["mps_clients"] = clients
            seen["stages_are_clients"] = set(stage_pids) <= set(clients)

    done, wall = asyncio.run(run(cfg, inspect))
    seen["left_after_shutdown"] = wait_clean(CLEANUP_S)
    return done, wall, seen


def child_main() -> int:
    """Start a daemon and a CUDA client on it, say so, and wait to be SIGKILLed."""
    daemon = MpsDaemon.start(Path(tempfile.gettempdir()) / "mps_check_guard.log")
    code = "import torch, sys, time; torch.ones(1, device='cuda'); print('client up', flush=True); time.sleep(600)"
    preexec = None
    if sys.platform.startswith("linux"):
        import ctypes

        def preexec() -> None:  # dies with this process, as stage processes do (omni_mp.utils.procs)
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL, 0, 0, 0)

    client = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, PIPE_ENV: daemon.pipe}, stdout=subprocess.PIPE,
        preexec_fn=preexec,
    )  # fmt: skip
    assert client.stdout is not None
    client.stdout.readline()
    print(json.dumps({"pipe": daemon.pipe, "client": client.pid, "clients": daemon_clients(daemon.pipe)}), flush=True)
    time.sleep(600)
    return 1


def sigkill_round() -> dict[str, Any]:
    child = subprocess.Popen([sys.executable, __file__, "--child"], stdout=subprocess.PIPE)
    assert child.stdout is not None
    up = json.loads(child.stdout.readline())
    up["served_while_up"] = up["client"] in up["clients"]
    up["processes_while_up"] = len(mps_leftovers()["processes"])
    child.send_signal(signal.SIGKILL)
    child.wait()
    t0 = time.monotonic()
    up["left_after_sigkill"] = wait_clean(CLEANUP_S)
    up["cleanup_s"] = round(time.monotonic() - t0, 2)
    return up


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("mps_check.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child_main()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "left_before": mps_leftovers()}
    results = {}
    for mode in ("time_slice", "mps"):
        print(f"[mps check] tiny Qwen3-Omni pipeline, gpu_sharing {mode}", flush=True)
        results[mode], wall, seen = pipeline_round(mode)
        report[mode] = {"wall_s": round(wall, 2), **seen}
        print(f"[mps check] {mode}: {len(REQUESTS)} requests in {wall:.1f}s; {seen}", flush=True)
    rows = []
    for i in range(len(REQUESTS)):
        (ta, ca, aa), (tb, cb, ab) = outputs(results["time_slice"][i]), outputs(results["mps"][i])
        rel = float((aa - ab).norm() / aa.norm()) if aa.shape == ab.shape and aa.norm() > 0 else math.inf
        rows.append({"request": i, "thinker_equal": ta == tb, "frames_equal": ca == cb, "audio_rel_l2": rel})
    report["requests"] = rows
    print("[mps check] SIGKILL of a process that owns a daemon", flush=True)
    report["sigkill"] = sigkill_round()
    clean = [report[m]["left_after_shutdown"] for m in ("time_slice", "mps")]
    clean.append(report["sigkill"]["left_after_sigkill"])
    equal = [r["thinker_equal"] and r["frames_equal"] and r["audio_rel_l2"] <= AUDIO_RTOL for r in rows]
    checks = {
        "outputs_equal": all(equal),
        "mps_daemon_started": report["mps"]["daemon"] and not report["time_slice"]["daemon"],
        "stages_are_clients": bool(report["mps"].get("stages_are_clients")),
        "killed_owner_client_was_served": report["sigkill"]["served_while_up"],
        "nothing_left": not any(c["processes"] or c["dirs"] for c in clean),
    }
    report["checks"] = checks
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(checks), flush=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

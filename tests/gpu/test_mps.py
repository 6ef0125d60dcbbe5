"""GPU sharing under MPS (omni_mp.control.mps, `gpu_sharing` in the pipeline YAML) on one GPU (was
launch/gpu_mps_check.py):

1. The tiny Qwen3-Omni pipeline (omni_mp/stage_configs/tiny_qwen3_omni.yaml, fp32, CUDA graphs,
   every stage on GPU 0) serves the same 8 concurrent requests time-sliced and under MPS: thinker
   tokens, frames and audio must agree (test_omni_graphs's criteria). Under MPS the private
   daemon must list every stage process as its client while it serves.
2. After each shutdown: no MPS process (`nvidia-cuda-mps-*`) and no `omni-mps-*` directory left.
3. A process that started a daemon (tests/gpu/mps_owner.py: what the coordinator does) and has a
   CUDA client on it is SIGKILLed: the client ends with it (as a stage does, by its parent-death
   signal), and the guard must quit the daemon and remove its directory.
Skipped where nvidia-cuda-mps-control is not installed.
"""

from __future__ import annotations

import asyncio
import glob
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.helpers import REPO
from tests.gpu.mps_owner import daemon_clients
from tests.gpu.omni_graphs import AUDIO_RTOL, QWEN3_REQUESTS, media, outputs, rel_l2, run, tiny_config

MPS_PROCS = "nvidia-cuda-mps"  # the control daemon and its servers
CLEANUP_S = 60.0  # for the guard to quit the daemon once its coordinator is gone
REQUESTS = QWEN3_REQUESTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="no nvidia-cuda-mps-control here"),
]


def mps_leftovers() -> dict[str, list[Any]]:
    """MPS processes and our daemons' directories still on this host."""
    import psutil

    procs = [p.info for p in psutil.process_iter(["pid", "name"]) if (p.info["name"] or "").startswith(MPS_PROCS)]
    return {"processes": procs, "dirs": glob.glob(str(Path(tempfile.gettempdir()) / "omni-mps-*"))}


def wait_clean(timeout_s: float) -> dict[str, list[Any]]:
    deadline = time.monotonic() + timeout_s
    while (left := mps_leftovers())["processes"] or left["dirs"]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return left


def pipeline_round(mode: str) -> tuple[list[Any], float, dict[str, Any]]:
    import msgspec

    from omni_mp.config.schema import GpuSharingConfig

    cfg = msgspec.structs.replace(tiny_config("tiny_qwen3_omni", "graphs", 1), gpu_sharing=GpuSharingConfig(mode=mode))
    seen: dict[str, Any] = {}

    def inspect(coord: Any) -> None:
        stage_pids = sorted(h.pid for h in coord.stages.values())
        seen["stage_pids"] = stage_pids
        seen["daemon"] = coord.mps is not None
        if coord.mps is not None:
            clients = sorted(daemon_clients(coord.mps.pipe))
            seen["mps_clients"] = clients
            seen["stages_are_clients"] = set(stage_pids) <= set(clients)

    jobs = [(r["text"], {**media(r, 1.0, 64), "speaker": r["speaker"], "deadline_s": 900}) for r in REQUESTS]
    done, wall = asyncio.run(run(cfg, jobs, inspect))
    seen["left_after_shutdown"] = wait_clean(CLEANUP_S)
    return done, wall, seen


def sigkill_round() -> dict[str, Any]:
    child = subprocess.Popen([sys.executable, "-m", "tests.gpu.mps_owner"], cwd=REPO, stdout=subprocess.PIPE)
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


def test_mps_serves_alike_and_leaves_nothing(report: Callable[[dict[str, Any]], Path]) -> None:
    doc: dict[str, Any] = {"left_before": mps_leftovers()}
    results = {}
    for mode in ("time_slice", "mps"):
        print(f"[mps check] tiny Qwen3-Omni pipeline, gpu_sharing {mode}", flush=True)
        results[mode], wall, seen = pipeline_round(mode)
        doc[mode] = {"wall_s": round(wall, 2), **seen}
        print(f"[mps check] {mode}: {len(REQUESTS)} requests in {wall:.1f}s; {seen}", flush=True)
    rows = []
    for i in range(len(REQUESTS)):
        (ta, ca, aa), (tb, cb, ab) = outputs(results["time_slice"][i]), outputs(results["mps"][i])
        rows.append({"request": i, "thinker_equal": ta == tb, "frames_equal": ca == cb, "audio_rel_l2": rel_l2(aa, ab)})
    doc["requests"] = rows
    print("[mps check] SIGKILL of a process that owns a daemon", flush=True)
    doc["sigkill"] = sigkill_round()
    clean = [doc[m]["left_after_shutdown"] for m in ("time_slice", "mps")]
    clean.append(doc["sigkill"]["left_after_sigkill"])
    equal = [r["thinker_equal"] and r["frames_equal"] and r["audio_rel_l2"] <= AUDIO_RTOL for r in rows]
    checks = {
        "outputs_equal": all(equal),
        "mps_daemon_started": doc["mps"]["daemon"] and not doc["time_slice"]["daemon"],
        "stages_are_clients": bool(doc["mps"].get("stages_are_clients")),
        "killed_owner_client_was_served": doc["sigkill"]["served_while_up"],
        "nothing_left": not any(c["processes"] or c["dirs"] for c in clean),
    }
    doc["checks"] = checks
    report(doc)
    assert all(checks.values()), checks

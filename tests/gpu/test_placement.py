"""GPU placement (was launch/gpu_check.py): a pipeline whose stages are pinned to GPUs
(omni_mp/stage_configs/tiny_chain_gpu.yaml: stage 0 on GPU 0, stage 1 on GPU 1). From inside
each stage process (its status info) it sees exactly its own GPUs; nvidia-smi, where it can see
the stage processes (not inside every container's PID namespace), puts each on its GPU."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.helpers import gpus

pytestmark = pytest.mark.gpu

PROMPTS = ["Hello world, how are you?", "The quick brown fox"]


def nvidia_smi(query: str, kind: str) -> list[list[str]]:
    """nvidia-smi's CSV rows of `--query-<kind>=<query>` (none where nvidia-smi is missing)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{kind}={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True
        ).stdout
    except FileNotFoundError:
        return []
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]


@gpus(2)
def test_each_stage_sees_only_its_own_gpu(report: Callable[[dict[str, Any]], Path]) -> None:
    from omni_mp.client.omni_client import OmniClient
    from omni_mp.config.validate import load_config
    from omni_mp.control.embedded import embedded_pipeline
    from omni_mp.stage_configs import shipped_config

    cfg = load_config(shipped_config("tiny_chain_gpu"))
    with embedded_pipeline(cfg, progress=lambda m: print(f"[omni_mp] {m}", flush=True)) as coord:
        with OmniClient(coord.client_endpoint) as client:
            for prompt in PROMPTS:
                done = client.generate(prompt, timeout_s=300)
                print(f"{prompt!r} -> stage {done.outputs[-1].stage_id}: {done.outputs[-1].token_ids}")
                assert len(done.outputs[-1].token_ids) == 16  # the config's max_tokens, ignore_eos
            status = client.status()
            index = {uuid: int(idx) for idx, uuid, *_ in nvidia_smi("index,uuid,name,memory.used", "gpu")}
            apps = nvidia_smi("pid,gpu_uuid,used_memory", "compute-apps")
    rows = []
    for s in status.stages:
        devices = cfg.stage(s.stage_id).devices
        seen = sorted({index.get(uuid, -1) for pid, uuid, *_ in apps if pid == str(s.pid)})
        rows.append({"stage": s.stage_id, "pid": s.pid, "devices": devices, "info": s.info, "nvidia_smi_gpus": seen})
        print(rows[-1], flush=True)
        assert s.info["cuda_visible_devices"] == ",".join(map(str, devices)), s.info
        assert s.info["torch_cuda_device_count"] == str(len(devices)), s.info
        assert not seen or seen == devices, f"stage {s.stage_id} (devices {devices}) runs on GPUs {seen}"
    report({"stages": rows, "compute_apps": apps})

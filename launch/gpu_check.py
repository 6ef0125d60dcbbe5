"""GPU placement check: run a pipeline whose stages are pinned to GPUs, and show from inside
each stage process which GPUs it sees, and from nvidia-smi which GPU each process uses.

    python launch/gpu_check.py --config omni_mp/stage_configs/tiny_chain_gpu.yaml
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omni_mp.client.omni_client import OmniClient  # noqa: E402
from omni_mp.config.validate import load_config  # noqa: E402
from omni_mp.control.embedded import embedded_pipeline  # noqa: E402


def nvidia_smi(query: str, kind: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-{kind}={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--prompt", action="append", default=["Hello world, how are you?", "The quick brown fox"])
    p.add_argument("--log-dir", type=Path, help="keep stage logs here")
    args = p.parse_args()
    cfg = load_config(args.config)
    progress = lambda m: print(f"[omni_mp] {m}", flush=True)  # noqa: E731
    with embedded_pipeline(cfg, log_dir=args.log_dir, progress=progress) as coord:
        with OmniClient(coord.client_endpoint) as client:
            for prompt in args.prompt:
                done = client.generate(prompt, timeout_s=300)
                print(f"{prompt!r} -> stage {done.outputs[-1].stage_id}: {done.outputs[-1].token_ids}")
            status = client.status()
            gpus = {uuid: idx for idx, uuid, *_ in nvidia_smi("index,uuid,name,memory.used", "gpu")}
            apps = nvidia_smi("pid,gpu_uuid,used_memory", "compute-apps")
            print(
                "\nstage | pid | config devices | seen from inside the stage process"
                " | nvidia-smi: GPU (MiB used by this pid)"
            )
            for s in status.stages:
                dev = cfg.stage(s.stage_id).devices
                used = [f"GPU {gpus.get(u, u)} ({m} MiB)" for pid, u, m in apps if pid == str(s.pid)]
                inside = ", ".join(f"{k}={v}" for k, v in sorted(s.info.items()) if k.startswith(("cuda", "torch")))
                print(f"{s.stage_id} | {s.pid} | {dev} | {inside} | {'; '.join(used) or 'none'}")
            print("\nnvidia-smi --query-compute-apps:")
            for row in apps:
                print("  " + ", ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

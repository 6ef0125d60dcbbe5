"""How long a CPU pipeline takes from `python -m omni_mp.launch` to its answers and exit, with and
without inductor's SIMD-ISA probe in its eager AR stages, side by side (alternating runs).

A vLLM 0.25.0 CPU engine compiles its sampler with inductor at start-up, and inductor first
probes every ISA the CPU flags name (a build each, loaded by a fresh `python -c "import torch"`).
An eager CPU AR stage skips it (omni_mp.control.stage_handle.stage_env sets
`TORCHINDUCTOR_VEC_ISA_OK=0` unless the environment says otherwise); `probe` runs set it to a
value inductor reads as unset (`auto`), so every stage probes as it did before.

    python -m benchmarks.cpu_start [--config tiny_qwen2_5_omni] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run(config: str, probe: bool) -> float:
    """Seconds from the launcher's start to its exit after one prompt's answer."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    if probe:
        env["TORCHINDUCTOR_VEC_ISA_OK"] = "auto"  # neither "0" nor "1": inductor probes
    with tempfile.TemporaryDirectory(prefix="cpu_start-") as out:
        cmd = [sys.executable, "-m", "omni_mp.launch", "--config", config, "--prompt", "Hello there."]
        cmd += ["--output-dir", out]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the launcher failed (probe={probe}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny_qwen2_5_omni", help="a shipped config name or a YAML path")
    p.add_argument("--rounds", type=int, default=2, help="runs of each, alternating")
    args = p.parse_args()
    runs: dict[str, list[float]] = {"probe": [], "skip": []}
    for _ in range(args.rounds):
        for name in runs:
            runs[name].append(one_run(args.config, probe=name == "probe"))
            print(f"{name}: {runs[name][-1]:.1f} s", flush=True)
    probe, skip = (statistics.median(runs[k]) for k in ("probe", "skip"))
    print(f"# {os.cpu_count()} CPUs; {args.config}, one prompt, launch to exit (median of {args.rounds})")
    print(f"with the ISA probe {probe:.1f} s, without {skip:.1f} s: {probe / skip:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Phases in fresh processes: a runner re-runs itself as `python -m benchmarks.<runner> --phase
NAME ...` (so GPU memory is returned between phases), the child writes `<out>/<NAME>.json`, and
the parent's report is made from every phase file in `--out` (phases can run in separate
invocations, e.g. separate device calls)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common.report import phase_error

REPO = Path(__file__).resolve().parents[2]  # the checkout: `python -m benchmarks.X` runs from here


def module_cmd(module: str, *args: str) -> list[str]:
    """The command line of `python -m module args` with this interpreter (run it with cwd=REPO)."""
    return [sys.executable, "-m", module, *args]


def device_name() -> str:
    """GPU 0's name, or the CPU's core count."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers ("1,8,32") as a list: an argparse type."""
    return [int(x) for x in text.split(",") if x]


def add_gpu_sharing_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu-sharing",
        choices=("auto", "mps", "time_slice"),
        default="auto",
        help="how stages on one GPU share it (the pipeline's gpu_sharing.mode; default auto: under MPS where "
        "nvidia-cuda-mps-control is installed, else time-sliced); time_slice for the A/B",
    )


def child_error(result: Path) -> str | None:
    """The error a failed phase process wrote, if it got that far (a killed one may not have)."""
    try:
        return json.loads(result.read_text()).get("error")
    except (OSError, ValueError, AttributeError):
        return None


def run_child_phase(
    result: Path, run: Callable[[], dict[str, Any]], write: Callable[[dict[str, Any]], None] | None = None
) -> int:
    """In the phase's process: `run()` and its result written to `result` (by `write` if given),
    or, when it raises, its error (for the parent's report) before the exception goes on."""
    try:
        data = run()
    except Exception as e:
        result.write_text(json.dumps({"error": phase_error(e)}))
        raise
    if write is not None:
        write(data)
    else:
        result.write_text(json.dumps(data))
    return 0


def phase_timeout(timeout_s: float, deadline: float | None, margin_s: float) -> float:
    """A phase's limit: `timeout_s`, or less where the run's `deadline` (perf_counter) minus the
    report's `margin_s` comes first."""
    if deadline is None:
        return timeout_s
    return min(timeout_s, deadline - time.perf_counter() - margin_s)


def run_phase_process(
    module: str,
    phase: str,
    out: Path,
    *,
    timeout_s: float,
    say: Callable[[str], None],
    deadline: float | None = None,
    margin_s: float = 15,
    min_s: float = 30,
    env: dict[str, str] | None = None,
    fresh: bool = False,
    write_errors: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`python -m module --phase PHASE <this process's arguments>` in a fresh process, within
    `timeout_s` and what is left of `deadline`; returns its `<out>/<PHASE>.json` with the
    phase's wall time ("phase_s") added, or {"error": ...} (written there too, unless not
    `write_errors`) when it failed, was killed or could not start for want of time (`min_s`).
    `fresh`: the result file is removed first, so a failed child leaves its error, nothing older;
    `extra`: fields added to a successful phase's result."""
    result = out / f"{phase}.json"
    timeout = phase_timeout(timeout_s, deadline, margin_s)
    if timeout < min_s:
        data: dict[str, Any] = {"error": f"skipped: {timeout + margin_s:.0f}s left of --deadline-s"}
        say(f"phase {phase} {data['error']}")
        if write_errors:
            result.write_text(json.dumps(data))
        return data
    if fresh:
        result.unlink(missing_ok=True)
    say(f"phase {phase} (limit {timeout:.0f}s) ...")
    t0 = time.perf_counter()
    try:
        code: int | str = subprocess.run(
            module_cmd(module, "--phase", phase, *sys.argv[1:]), cwd=REPO, timeout=timeout, env=env
        ).returncode
    except subprocess.TimeoutExpired:
        code = f"timeout after {timeout:.0f}s"
    if code != 0 or not result.exists():
        child = child_error(result)
        data = {"error": f"exit code {code}" + (f": {child}" if child else "")}
        say(f"phase {phase} failed: {data['error']}")
        if write_errors:
            result.write_text(json.dumps(data))
        return data
    data = json.loads(result.read_text())
    data["phase_s"] = time.perf_counter() - t0
    data.update(extra or {})
    result.write_text(json.dumps(data))
    say(f"phase {phase} done in {data['phase_s']:.0f}s")
    return data


def phase_results(out: Path, phases: list[str]) -> dict[str, Any]:
    """Every phase file of `phases` in `out`, by phase name."""
    return {f.stem: json.loads(f.read_text()) for f in sorted(out.glob("*.json")) if f.stem in phases}


def devices_of(results: dict[str, Any]) -> str:
    """The devices the phases ran on, as one name ("A / B" where they differ)."""
    devices = sorted({r["device"] for r in results.values() if isinstance(r, dict) and r.get("device")})
    return " / ".join(devices) or "unknown device"


def split_phases(text: str, known: list[str]) -> list[str]:
    """--phases "a,b" -> ["a", "b"] (empty: only the report is made); SystemExit naming unknown ones."""
    phases = list(filter(None, text.split(",")))
    unknown = [p for p in phases if p not in known]
    if unknown:
        raise SystemExit(f"unknown phases {unknown}; known: {known}")
    return phases

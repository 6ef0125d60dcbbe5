"""A PyTorch profile of a window of one stage's engine steps (`OMNI_MP_TORCH_PROFILE`), for
finding where a step's time goes: on the host (vLLM's scheduler and runner, our loop) or on
the GPU (this process's kernels).

`OMNI_MP_TORCH_PROFILE` is a JSON list of windows, `[{"dir": ..., "stage": 1, "first_step": 420,
"steps": 60}]`; a stage profiles the windows that name it, counting steps as its timeline does
(every engine step of the loop since the stage started). At a window's end it writes, in `dir`:
  torch-stage{N}-{first}.txt       what the window took: wall time, this process's kernels and copies (count,
                                   the time the GPU ran at least one of them, their sum), the
                                   host scopes (`omni:` ours, `gpu_model_runner:` vLLM's) and the
                                   top operators by host and by device time;
  torch-stage{N}-{first}.trace.json.gz  the Chrome trace (chrome://tracing, ui.perfetto.dev).
Only for diagnosis: profiling slows the host side of every step it records, and on a GPU the
process stayed slower after its window too (the talker's steps 3.3 against 2.5-2.8 ms in the
rounds after): time nothing in a profiled run.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec

TORCH_PROFILE_ENV = "OMNI_MP_TORCH_PROFILE"
# vLLM 0.25.0's runner opens its `record_function` scopes (preprocess, forward, sample, ...)
# only when this is set in its process before the runner first asks.
VLLM_SCOPES_ENV = "VLLM_CUSTOM_SCOPES_FOR_PROFILING"


class ProfileWindow(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dir: str
    stage: int
    first_step: int
    steps: int

    def __post_init__(self) -> None:
        if self.first_step < 0 or not 1 <= self.steps <= 10_000:
            raise ValueError(f"profile window: first_step >= 0 and 1 <= steps <= 10000, got {self}")


def windows_from_env(stage_id: int) -> list[ProfileWindow]:
    """The windows `OMNI_MP_TORCH_PROFILE` names for this stage (a malformed value raises)."""
    raw = os.environ.get(TORCH_PROFILE_ENV)
    if not raw:
        return []
    windows = msgspec.json.decode(raw, type=list[ProfileWindow])
    return sorted((w for w in windows if w.stage == stage_id), key=lambda w: w.first_step)


def enable_vllm_scopes(stage_id: int) -> None:
    """Before the engine is built: a stage with a window gets vLLM's runner scopes."""
    if windows_from_env(stage_id):
        os.environ.setdefault(VLLM_SCOPES_ENV, "1")


def kernel_busy(intervals: list[tuple[int, int]]) -> tuple[int, int]:
    """(time covered by at least one interval, sum of lengths), for [start, end) pairs."""
    covered = total = 0
    end_so_far = None
    for start, end in sorted(intervals):
        total += end - start
        if end_so_far is None or start >= end_so_far:
            covered += end - start
            end_so_far = end
        elif end > end_so_far:
            covered += end - end_so_far
            end_so_far = end
    return covered, total


class StepProfiler:
    """Starts torch.profiler before the first step of each window and writes the report after
    its last; `scope(name)` marks a part of the loop in the profile (free when not profiling)."""

    def __init__(self, stage_id: int) -> None:
        self.stage_id = stage_id
        self.windows = windows_from_env(stage_id)
        self._prof: Any = None
        self._window: ProfileWindow | None = None
        self._t0 = 0.0

    def scope(self, name: str) -> contextlib.AbstractContextManager[Any]:
        if self._prof is None:
            return contextlib.nullcontext()
        import torch

        return torch.profiler.record_function(name)

    def at(self, step: int) -> Path | None:
        """Called before each loop iteration with the number of the next engine step: starts a
        window's profile at its first step, and ends it (writing the report) after its last."""
        window = self._window
        if self._prof is not None and window is not None and step >= window.first_step + window.steps:
            return self._stop(window)
        while self._prof is None and self.windows and self.windows[0].first_step < step:
            self.windows.pop(0)  # begins inside an earlier window: skipped
        if self._prof is None and self.windows and self.windows[0].first_step == step:
            self._start(self.windows.pop(0))
        return None

    def close(self, step: int) -> Path | None:
        """The stage stops: a window still open is written with the steps it saw."""
        window = self._window
        if self._prof is None or window is None:
            return None
        return self._stop(msgspec.structs.replace(window, steps=max(1, step - window.first_step)))

    def _start(self, window: ProfileWindow) -> None:
        import torch
        from torch.profiler import ProfilerActivity

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._window = window
        self._prof = torch.profiler.profile(activities=activities)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def _stop(self, window: ProfileWindow) -> Path:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the window's kernels are in the profile
        wall_ms = (time.perf_counter() - self._t0) * 1000
        prof, self._prof, self._window = self._prof, None, None
        prof.__exit__(None, None, None)
        return self._write(prof, window, wall_ms)

    def _write(self, prof: Any, window: ProfileWindow, wall_ms: float) -> Path:
        out = Path(window.dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"torch-stage{self.stage_id}-{window.first_step}"
        kernels = [
            (e.start_ns(), e.start_ns() + e.duration_ns())
            for e in prof.profiler.kineto_results.events()
            # kernels and copies; not the GPU-side spans of `record_function` scopes
            if e.device_type().name == "CUDA" and e.duration_ns() > 0 and not e.is_user_annotation()
        ]
        covered, total = kernel_busy(kernels)
        busy_ms = covered / 1e6
        averages = prof.key_averages()
        scopes = sorted(
            # the host side of each scope (its GPU-side span is listed under the same name, with no host time)
            (a for a in averages if a.key.startswith(("omni:", "gpu_model_runner:")) and a.cpu_time_total > 0),
            key=lambda a: -a.cpu_time_total,
        )
        n = window.steps
        ours = sum(a.cpu_time_total for a in scopes if a.key.startswith("omni:")) / 1e3  # not nested
        lines = [
            f"stage {self.stage_id}, engine steps {window.first_step}..{window.first_step + n - 1}",
            f"wall {wall_ms:.1f} ms, {wall_ms / n:.3f} ms a step",
            f"this process's kernels and copies: {len(kernels)} ({len(kernels) / n:.0f} a step); the GPU ran at least"
            f" one for {busy_ms:.1f} ms ({busy_ms / n:.3f} ms a step, {100 * busy_ms / wall_ms:.0f}% of the wall),"
            f" their sum {total / 1e6:.1f} ms",
            f"the engine thread in the loop's scopes: {ours / n:.3f} ms a step; the rest it waited for input",
            "",
            "host scopes (wall inside each, ms a step; nested scopes are inside their parents):",
            *(f"  {a.key:<44} {a.cpu_time_total / 1e3 / n:8.3f}  x{a.count / n:.2f}" for a in scopes),
            "",
            averages.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60),
            averages.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60),
        ]
        report = out / f"{stem}.txt"
        report.write_text("\n".join(lines) + "\n")
        trace = out / f"{stem}.trace.json"
        prof.export_chrome_trace(str(trace))
        with trace.open("rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
        return report

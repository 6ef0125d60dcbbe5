"""The profile window's arithmetic and its configuration (the window itself runs in a real
pipeline in tests/test_omni_gpu_bench.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from omni_mp.stage.torch_profile import TORCH_PROFILE_ENV, kernel_busy, windows_from_env


def test_kernel_busy_is_the_union_of_the_intervals() -> None:
    """Against counting every covered nanosecond of random overlapping intervals."""
    rng = random.Random(7)
    for _ in range(200):
        intervals = []
        for _ in range(rng.randint(0, 12)):
            start = rng.randint(0, 300)
            intervals.append((start, start + rng.randint(0, 60)))
        covered = set()
        for start, end in intervals:
            covered.update(range(start, end))
        assert kernel_busy(intervals) == (len(covered), sum(end - start for start, end in intervals))


def test_windows_are_read_for_their_stage_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    windows = [
        {"dir": "/tmp/p", "stage": 1, "first_step": 90, "steps": 5},
        {"dir": "/tmp/p", "stage": 0, "first_step": 7, "steps": 3},
        {"dir": "/tmp/p", "stage": 1, "first_step": 20, "steps": 10},
    ]
    monkeypatch.setenv(TORCH_PROFILE_ENV, msgspec.json.encode(windows).decode())
    assert [w.first_step for w in windows_from_env(1)] == [20, 90]
    assert windows_from_env(2) == []
    monkeypatch.setenv(TORCH_PROFILE_ENV, '[{"dir": "/tmp/p", "stage": 1, "first_step": 3, "steps": 0}]')
    with pytest.raises(msgspec.ValidationError, match="steps"):
        windows_from_env(1)
    monkeypatch.setenv(TORCH_PROFILE_ENV, '[{"dir": "/tmp/p", "stage": 1, "first": 3, "steps": 2}]')
    with pytest.raises(msgspec.ValidationError, match="first"):
        windows_from_env(1)


def test_the_benchmark_refuses_a_malformed_window() -> None:
    """`omni_gpu.py --torch-profile` names the part it cannot read, before anything starts."""
    repo = Path(__file__).resolve().parent.parent
    run = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "omni_gpu.py"), "--torch-profile", "1:30:12,1:30", "--phases", ""],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "'1:30': want STAGE:FIRST_STEP:STEPS" in run.stderr

"""CUDA graphs of the Qwen3-Omni talker stage (was launch/gpu_qwen3_talker_check.py): our vLLM talker
(the code predictor inside its step) on the tiny checkpoint, fp32, eager and with vLLM's default
(torch.compile + CUDA graphs), each in a process of its own (tests/gpu/talker_modes.py), against
transformers' `generate` (fp32, greedy, on the CPU): 8 concurrent requests, every frame's 16
codes and the group-0 tokens equal to transformers' in both modes. The report also says how
many forwards ran in Python (a replayed CUDA graph runs none)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.helpers import REPO

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["eager", "graphs"])
def test_codes_equal_transformers(mode: str, tmp_path: Path, report: Callable[[dict[str, Any]], Path]) -> None:
    out = tmp_path / "mode.json"
    done = subprocess.run([sys.executable, "-m", "tests.gpu.talker_modes", mode, "cuda", str(out)], cwd=REPO)
    assert done.returncode == 0 and out.exists(), f"{mode}: failed (exit {done.returncode})"
    result = json.loads(out.read_text())
    report({"mode": mode, **result})
    print(f"[check] {mode}: {result['info']}")
    differ = []
    for row in result["requests"]:
        verdict = "AGREE" if row["agree"] else f"DIFFER {row.get('first_diff', '')}"
        print(f"  {row['request']} {row['case']:5s} {row['speaker']:7s} frames {row['frames']:3d}: {verdict}")
        if not row["agree"]:
            differ.append(row)
    assert not differ, differ

"""CUDA graphs of the Qwen3-Omni talker stage (was launch/gpu_qwen3_talker_check.py): our vLLM talker
(the code predictor inside its step) on the tiny checkpoint, fp32, eager and with vLLM's default
(torch.compile + CUDA graphs), each in a process of its own (tests/gpu/talker_modes.py), against
transformers' `generate` (fp32, greedy, on the CPU): 8 concurrent requests, every frame's 16
codes and the group-0 tokens: the same in both modes, and equal to transformers' but at the
known near-ties (two of the 8 on an H200). The report also says how
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


# On the GPU in fp32 two of the 8 requests meet a near-tie against transformers on the CPU (an
# image one at frame 7, an audio one at frame 11, in every run since this check was written:
# docs/results/qwen3_omni/qwen3_talker_check_h200.json); the rest agree frame for frame.
MIN_AGREE_WITH_TRANSFORMERS = 6


def _run_mode(mode: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{mode}.json"
    done = subprocess.run([sys.executable, "-m", "tests.gpu.talker_modes", mode, "cuda", str(out)], cwd=REPO)
    assert done.returncode == 0 and out.exists(), f"{mode}: failed (exit {done.returncode})"
    result = json.loads(out.read_text())
    print(f"[check] {mode}: {result['info']}")
    for row in result["requests"]:
        verdict = "AGREE" if row["agree"] else f"DIFFER {row.get('first_diff', '')}"
        print(f"  {row['request']} {row['case']:5s} {row['speaker']:7s} frames {row['frames']:3d}: {verdict}")
    return result


def test_graphs_equal_eager_and_transformers_but_near_ties(
    tmp_path: Path, report: Callable[[dict[str, Any]], Path]
) -> None:
    """CUDA graphs change nothing: every request's comparison with transformers (agreement, or
    the first frame, group and count of differing codes) is the same in both modes; and at
    most the known near-ties differ from transformers."""
    modes = {mode: _run_mode(mode, tmp_path) for mode in ("eager", "graphs")}
    report(modes)
    verdicts = {
        mode: [(r["request"], r["frames"], r["got_frames"], r["agree"], r.get("first_diff")) for r in res["requests"]]
        for mode, res in modes.items()
    }
    assert verdicts["graphs"] == verdicts["eager"], verdicts
    assert all(got == want for _, want, got, _, _ in verdicts["eager"]), verdicts["eager"]
    agree = sum(ok for *_, ok, _ in verdicts["eager"])
    assert agree >= MIN_AGREE_WITH_TRANSFORMERS, verdicts["eager"]

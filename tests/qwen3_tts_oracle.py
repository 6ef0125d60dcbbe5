"""The qwen-tts reference (0.1.1) as an oracle: tests/oracles/qwen_tts_ref.py run in the reference's
own venv (scripts/oracle_envs/qwen_tts.sh; $OMNI_MP_QWEN_TTS_VENV or .venv-qwen-tts), requests in
as JSON, codes and waveforms back as npz (no pickle across the boundary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "oracles" / "qwen_tts_ref.py"


def reference_python() -> Path | None:
    venv = Path(os.environ.get("OMNI_MP_QWEN_TTS_VENV", ROOT / ".venv-qwen-tts"))
    py = venv / "bin" / "python"
    return py if py.exists() else None


def require_reference() -> Path:
    """The reference venv's python, or skip naming what is missing and how to build it."""
    py = reference_python()
    if py is None:
        pytest.skip(
            "qwen-tts reference venv absent (set OMNI_MP_QWEN_TTS_VENV or run "
            "scripts/oracle_envs/qwen_tts.sh .venv-qwen-tts; scripts/setup.sh builds it)"
        )
    return py


@dataclass
class OracleRun:
    codes: list[np.ndarray]  # per request: [frames, 16] int64
    wavs: list[np.ndarray]  # per request: float32 at 24 kHz
    extras: list[dict[str, np.ndarray]]  # per request: talker inputs as generate builds them, token ids
    report: dict[str, Any]  # load check (missing / unexpected tensors), per-request errors, versions


def run_reference(model_dir: Path, requests: list[dict[str, Any]], timeout: float = 600) -> OracleRun:
    py = require_reference()
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "in.json", Path(tmp) / "out.npz"
        spec.write_text(json.dumps({"model_dir": str(model_dir), "requests": requests}))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [str(py), str(RUNNER), str(spec), str(out)], capture_output=True, text=True, timeout=timeout, env=env
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise RuntimeError(f"qwen-tts reference exited {done.returncode}: {done.stderr[-600:]}")
        z = np.load(out, allow_pickle=False)
        n = len(requests)
        report = json.loads(bytes(z["report"]).decode())
        codes = [z[f"codes_{i}"] if f"codes_{i}" in z.files else np.zeros((0, 16), np.int64) for i in range(n)]
        wavs = [z[f"wav_{i}"] if f"wav_{i}" in z.files else np.zeros(0, np.float32) for i in range(n)]
        keys = (
            "inputs_embeds",
            "trailing_text_hidden",
            "tts_pad_embed",
            "text_ids",
            "instruct_ids",
            "speaker_embedding",
            "ref_codes",
            "cp_logits",
        )
        extras = [{k: z[f"{k}_{i}"] for k in keys if f"{k}_{i}" in z.files} for i in range(n)]
    return OracleRun(codes, wavs, extras, report)


def warped_scores(logits: torch.Tensor, subtalker: dict[str, Any]) -> torch.Tensor:
    """The reference's code predictor scores for its `subtalker_*` settings: transformers' warpers
    as its generate adds them (temperature unless 1, top-k unless 0, top-p below 1, in that order),
    float64; -inf outside the kept set. [.., V] -> [.., V]."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    flat = logits.reshape(-1, logits.shape[-1]).double()
    if subtalker["subtalker_temperature"] != 1.0:
        flat = TemperatureLogitsWarper(subtalker["subtalker_temperature"])(None, flat)
    if subtalker["subtalker_top_k"]:
        flat = TopKLogitsWarper(subtalker["subtalker_top_k"])(None, flat)
    if subtalker["subtalker_top_p"] < 1.0:
        flat = TopPLogitsWarper(subtalker["subtalker_top_p"])(None, flat)
    return flat.view(logits.shape)

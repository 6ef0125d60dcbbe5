"""Every shipped CPU config runs with the launcher's defaults: `python -m omni_mp.launch --config
NAME --prompt P` (the demo's default config with no `--config` at all) ends with every request
served, each output written, and nothing left behind. A default the launcher or a stage fills in
(an image size, a voice, a token budget) must fit the stage it is sent to.

The GPU configs (`*_gpu.yaml` and the released-size ones) run the same way in tests/gpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from omni_mp.config.validate import load_config
from omni_mp.models.registry import makes_images
from omni_mp.stage_configs import DEFAULT, shipped, shipped_config

pytestmark = pytest.mark.engine

# The configs that run on CPU: the tiny ones, except the variants made for a GPU.
CPU_CONFIGS = [name for name in shipped() if name.startswith("tiny_") and not name.endswith("_gpu")]


def test_the_cpu_configs_are_found() -> None:
    assert DEFAULT in CPU_CONFIGS and len(CPU_CONFIGS) >= 6, CPU_CONFIGS


def _expected_files(name: str) -> set[str]:
    """The suffixes a request's outputs are written with: .json always, .wav for a final stage
    that speaks, .png for one that draws."""
    cfg = load_config(shipped_config(name), check_engine_args=False)
    out = {".json"}
    for s in cfg.final_stages:
        if s.kind == "diffusion":
            out.add(".png" if makes_images(s.diffusion.model_type) else ".wav")
    return out


@pytest.mark.parametrize("name", CPU_CONFIGS)
def test_a_shipped_config_runs_with_the_launchers_defaults(name: str, tmp_path: Path) -> None:
    config = [] if name == DEFAULT else ["--config", name]  # the demo's config is the default
    cmd = [sys.executable, "-m", "omni_mp.launch", *config, "--prompt", "a red circle", "--output-dir", str(tmp_path)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # Run from outside the checkout: the shipped configs are package data, found by name.
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert "1/1 requests succeeded" in proc.stdout + proc.stderr, tail
    written = {p.suffix for p in tmp_path.iterdir()}
    assert _expected_files(name) <= written, (sorted(written), tail)
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record.get("error") is None, record
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"processes left behind: {left}"

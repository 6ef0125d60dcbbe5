"""Every shipped config that runs on GPUs serves with the launcher's defaults (issue 46, item 7; the
CPU side, the tiny_* configs, is tests/test_shipped_configs.py): `python -m omni_mp.launch
--config <it> --prompt ... --output-dir DIR` exits 0 with every request succeeded and its
outputs written (a WAV for a final stage that speaks, a PNG for one that draws).

The configs whose stages name GPUs (`devices`) are found in omni_mp/stage_configs/: the tiny
*_gpu ones run as shipped (their built-in tiny checkpoints); the released-size ones
(qwen2_5_omni, qwen3_omni, qwen_image) name checkpoints this host does not have, so each runs
on a random-weight checkpoint of the released shapes that the project's own code writes
(tests/gpu/released_dirs.py), with only what such a checkpoint needs changed: every `model:`
pointed at it, `load_format: dummy` on the vLLM stages (the dir holds no weights for them), and
for Qwen2.5-Omni the talker ids that are neither a token2wav code nor a stop id suppressed
(released weights never sample them; random ones would, and token2wav refuses them). Launcher
flags, sizes, sampling, budgets and placement stay the shipped config's.
Each config needs the GPUs its stages name (skipped on a host with fewer).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gpu.helpers import REPO, gpus

pytestmark = pytest.mark.gpu

PROMPT = "Describe a sunny morning by the sea in two sentences."
RELEASED = ("qwen2_5_omni", "qwen3_omni", "qwen_image")


def gpu_configs() -> dict[str, int]:
    """Every shipped config whose stages name GPUs, and how many GPUs it needs."""
    from omni_mp.stage_configs import CONFIG_DIR

    out = {}
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        devices = {d for s in yaml.safe_load(path.read_text())["stages"] for d in s.get("devices") or []}
        if devices:
            out[path.stem] = max(devices) + 1
    return out


def talker_suppressed(model_dir: Path) -> list[int]:
    """Qwen2.5-Omni's talker ids that token2wav does not embed and the talker does not stop on."""
    cfg = json.loads((model_dir / "config.json").read_text())
    talker = cfg["talker_config"]
    codes = int(cfg["token2wav_config"]["dit_config"]["num_embeds"]) + 1  # DiTCodecEmbedding's rows
    stops = {int(talker["tts_codec_pad_token_id"]), int(talker["tts_codec_end_token_id"])}
    return [i for i in range(codes, int(talker["vocab_size"])) if i not in stops]


def on_random_weights(name: str, raw: dict[str, Any], out: Path) -> Path:
    """The shipped config `raw` on its released-shape random-weight checkpoint, written to `out`."""
    built = subprocess.run(
        [sys.executable, "-m", "tests.gpu.released_dirs", name], cwd=REPO, capture_output=True, text=True, timeout=3000
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    model = Path(built.stdout.strip().splitlines()[-1])
    for stage in raw["stages"]:
        stage["model"] = str(model)
        if stage.get("kind", "ar") != "diffusion":
            stage.setdefault("engine_args", {})["load_format"] = "dummy"
        if name == "qwen2_5_omni" and stage.get("model_part") == "talker":
            stage.setdefault("sampling", {})["suppress_token_ids"] = talker_suppressed(model)
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


@pytest.mark.parametrize("name", [pytest.param(n, marks=gpus(k)) for n, k in gpu_configs().items()])
def test_shipped_config_serves_with_the_launchers_defaults(
    name: str, tmp_path: Path, report: Callable[[dict[str, Any]], Path]
) -> None:
    from omni_mp.config.validate import load_config
    from omni_mp.models.registry import makes_images, names
    from omni_mp.stage_configs import shipped_config

    config = name  # a shipped config by name, as a user names it
    raw = yaml.safe_load(shipped_config(name).read_text())
    models = {s["model"] for s in raw["stages"]}
    if not models <= set(names("builtin_models")):
        assert name in RELEASED, f"{name}: no random-weight checkpoint of {sorted(models)} for this test"
        config = str(on_random_weights(name, raw, tmp_path / f"{name}.yaml"))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "omni_mp.launch", "--config", config, "--prompt", PROMPT, "--output-dir", str(out)]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=3000)
    tail = run.stdout[-2000:] + run.stderr[-4000:]
    print(tail)
    report({"config": name, "returncode": run.returncode, "stdout": run.stdout[-4000:], "stderr": run.stderr[-8000:]})
    assert run.returncode == 0 and "1/1 requests succeeded" in run.stdout + run.stderr, tail
    cfg = load_config(shipped_config(name), check_engine_args=False)
    wanted = {".json"} | {
        ".png" if makes_images(s.diffusion.model_type) else ".wav" for s in cfg.final_stages if s.kind == "diffusion"
    }
    assert wanted <= {p.suffix for p in out.iterdir()}, (sorted(p.name for p in out.iterdir()), tail)

"""Every shipped CPU config runs with the launcher's defaults: `python -m omni_mp.launch --config
NAME --prompt P` (the demo's default config with no `--config` at all) ends with every request
served, each output written, and nothing left behind. A default the launcher or a stage fills in
(an image size, a voice, a token budget) must fit the stage it is sent to.

The GPU configs (`*_gpu.yaml` and the released-size ones) run the same way in tests/gpu."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_mp.stage_configs import DEFAULT, shipped
from tests.launcher import REPO, check_shipped_run, config_args, run_cli

pytestmark = pytest.mark.engine

# The configs that run on CPU: the tiny ones, except the variants made for a GPU.
CPU_CONFIGS = [name for name in shipped() if name.startswith("tiny_") and not name.endswith("_gpu")]
# The configs that another test already runs through the CLI with the launcher's defaults (plus
# inputs of its own and an oracle on the output), from outside the checkout and under the same
# checks (`check_shipped_run`): run once there, not twice (about 35 s each on 2 cores).
RUN_ELSEWHERE = {
    DEFAULT: "tests/test_qwen2_5_omni_pipeline.py::test_cli_takes_audio_and_image_files_and_writes_wav",
    "tiny_chain": "tests/test_lifecycle.py::test_cli_runs_prompts_through_tiny_chain",
    "tiny_tts": "tests/test_diffusion_pipeline.py::test_cli_writes_wav",
    "tiny_qwen_image": "tests/test_qwen_image_outputs.py::test_cli_writes_one_png_per_request_with_size_and_seed",
}


def test_the_cpu_configs_are_found() -> None:
    assert DEFAULT in CPU_CONFIGS and len(CPU_CONFIGS) >= 6, CPU_CONFIGS


def test_the_runs_elsewhere_exist_and_check_the_same() -> None:
    for name, node in RUN_ELSEWHERE.items():
        path, test = node.split("::")
        source = (REPO / path).read_text()
        assert name in CPU_CONFIGS and f"\ndef {test}(" in source, node
        body = source[source.index(f"\ndef {test}(") :].split("\ndef ", 2)[1]
        assert "check_shipped_run(" in body and "run_cli(" in body, f"{node} does not run {name} as shipped"


@pytest.mark.parametrize("name", [n for n in CPU_CONFIGS if n not in RUN_ELSEWHERE])
def test_a_shipped_config_runs_with_the_launchers_defaults(name: str, tmp_path: Path) -> None:
    proc = run_cli(*config_args(name), "--prompt", "a red circle", "--output-dir", str(tmp_path), cwd=tmp_path)
    check_shipped_run(name, proc, tmp_path)

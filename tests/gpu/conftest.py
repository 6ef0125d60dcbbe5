"""The GPU checks (pytest marker `gpu`): CUDA graphs against eager and against the transformers and
diffusers oracles, stage placement, MPS, and every shipped GPU config with the launcher's
defaults. Run them on a GPU host (the GPU host recipe, scripts/gpu/, installs what they need):

    python -m pytest tests/gpu -m gpu

Without CUDA (`torch.cuda.is_available()` false) every test here is collected and skipped, in
seconds: the CPU suite (`pytest`, testpaths = tests) is unaffected. README.md in this folder
lists the tests, how many GPUs each needs and how to split them over time-limited device calls.
What a check measured is also written as JSON to $OMNI_MP_GPU_REPORTS (default
outputs/gpu_checks/), as the scripts they replace wrote it (docs/results cites those files).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.helpers import CUDA, HERE, REPO, device

if CUDA:
    # What the documented GPU runs set (scripts/gpu/): vLLM's FlashInfer sampler needs a JIT
    # build the lent hosts cannot do; without blake3 vLLM hashes media with sha256. The stage
    # processes and the subprocesses of these tests import this tree.
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    if importlib.util.find_spec("blake3") is None:
        os.environ.setdefault("VLLM_MM_HASHER_ALGORITHM", "sha256")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: every test here has the mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of this folder is marked `gpu` (its module says so too), and skipped where
    there is no CUDA device."""
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.gpu)
            if not CUDA:
                item.add_marker(skip)


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[dict[str, Any]], Path]:
    """`report(doc)` writes what a check measured to $OMNI_MP_GPU_REPORTS/<test id>.json."""

    def write(doc: dict[str, Any]) -> Path:
        out = Path(os.environ.get("OMNI_MP_GPU_REPORTS", REPO / "outputs" / "gpu_checks"))
        out.mkdir(parents=True, exist_ok=True)
        name = request.node.name.replace("[", "-").replace("]", "").replace("/", "_")
        path = out / f"{name}.json"
        path.write_text(json.dumps({"device": device(), **doc}, indent=1, default=str))
        print(f"[gpu check] report: {path}", flush=True)
        return path

    return write


@pytest.fixture(autouse=True)
def _return_gpu_memory() -> Any:
    """What a test's models left in this process's CUDA cache goes back to the GPU after it: the
    pipelines the next tests start budget the GPU's memory."""
    yield
    if CUDA and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()

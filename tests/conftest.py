"""Shared test setup: offline hub, bounded vLLM CPU resources, tiny models, leak checks."""

from __future__ import annotations

import os

# Before anything imports transformers/vLLM: nothing may come from a hub, and every vLLM CPU
# engine gets a small explicit KV cache (the default reserves most of the RAM).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every vLLM CPU engine compiles its sampler with inductor at start-up (`compiled_random_sample`,
# run by the warm-up's dummy sampling), and inductor first probes each SIMD ISA the CPU flags
# name: ten builds, each loaded by a fresh `python -c "import torch"`, 30-45 s of every AR
# stage's start on 2 cores (a tiny_single pipeline: ready in 62 s, 22 s without the probe).
# The processes this session starts (launchers, stages, benchmarks) skip it: inductor writes
# their kernels as scalar C++, the same computation without SIMD (that sampler kernel draws
# unseeded random samples; greedy and all-seeded batches do not run it). This process reads the
# setting first, so what it compiles itself (the token2wav tests' graphs) keeps torch's ISA.
import torch._inductor.config  # noqa: E402, F401

os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
# A local Ray cluster stays on loopback (omni_mp.control.ray_local); Ray reads this when it is
# first imported, and vLLM may import it before the Ray tests run.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

from omni_mp.models.generic.tiny import BUILTIN_SPECS, build_tiny_model  # noqa: E402
from tests.launcher import ServedPipeline  # noqa: E402
from tests.shared_servers import SHARED, group_modules  # noqa: E402


@pytest.fixture(scope="session")
def tiny_qwen2_dir() -> Path:
    return build_tiny_model(BUILTIN_SPECS["tiny-qwen2"])


# Served pipelines several modules share (tests/shared_servers.py): (pipeline, url), with KEY.
@pytest.fixture(scope="module")
def shared_tiny_qwen2_5_omni() -> tuple[ServedPipeline, str]:
    return SHARED.get("tiny_qwen2_5_omni")


@pytest.fixture(scope="module")
def shared_tiny_qwen3_omni() -> tuple[ServedPipeline, str]:
    return SHARED.get("tiny_qwen3_omni")


@pytest.fixture(scope="module")
def shared_tiny_qwen3_tts() -> tuple[ServedPipeline, str]:
    return SHARED.get("tiny_qwen3_tts")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    group_modules(items, SHARED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the test's own fixtures are finalized first
    SHARED.release_unneeded(nextitem)


def _is_helper(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker lives as long as the test process by design."""
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any test left a child process behind (session fixtures are torn down by now)."""
    SHARED.close_all()  # already stopped after their last module, unless the run was interrupted
    children = [p for p in psutil.Process().children(recursive=True) if p.is_running() and not _is_helper(p)]
    if children:
        gone, alive = psutil.wait_procs(children, timeout=10)
        if alive:
            desc = ", ".join(f"{p.pid}:{' '.join(p.cmdline())[:200]}" for p in alive)
            print(f"\n[omni_mp] ERROR: processes left behind after the test session: {desc}")
            for p in alive:
                p.kill()
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""GPU memory facts both planes need: the coordinator's budget planner
(omni_mp.control.memory_budget) and a stage's own check (omni_mp.stage.memory_check)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

GiB = 2**30
# A process's CUDA context (driver, cuBLAS workspaces) is outside torch's counters; vLLM's
# start-up snapshot already sees it as used, so the utilization share leaves it out.
CUDA_CONTEXT_BYTES = GiB


class MemoryBudgetError(ValueError):
    """A budget cannot fit, or a stage outgrew it; the message names every number."""


def nvml_module() -> Any:
    """NVML's Python bindings: the `pynvml` package, else the copy vLLM ships; None: neither."""
    try:
        import pynvml

        return pynvml
    except ImportError:
        pass
    try:
        from vllm.third_party import pynvml

        return pynvml
    except ImportError:
        return None


@contextmanager
def nvml() -> Iterator[Any]:
    """NVML initialised for the block: the bindings, or None (none installed, or no driver).
    An NVML error inside the block ends it, logged, and goes no further."""
    pynvml = nvml_module()
    if pynvml is None:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        log.info("NVML unavailable (%s)", err)
        yield None
        return
    try:
        yield pynvml
    except pynvml.NVMLError as err:
        log.info("NVML failed (%s)", err)
    finally:
        pynvml.nvmlShutdown()


def nvml_indices(entries: list[str]) -> list[int] | None:
    """NVML's indices of CUDA_VISIBLE_DEVICES entries (omni_mp.utils.devices); None: NVML is
    not available or an entry is not found."""
    from omni_mp.utils.devices import nvml_index

    with nvml() as pynvml:
        if pynvml is None:
            return None

        def by_uuid(uuid: str) -> int | None:
            return int(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)))

        out = [nvml_index(e, by_uuid) for e in entries]
        return None if any(i is None for i in out) else [i for i in out if i is not None]
    return None


def process_gpu_bytes(pid: int, devices: list[int]) -> dict[int, int] | None:
    """Bytes `pid` holds on each of `devices` (NVML indices), as the driver counts them: every
    allocation of the process (PyTorch's cached blocks, CUDA graph pools, the CUDA context,
    library workspaces). None: NVML is not available, or it does not list this process (a
    container whose pid namespace differs from the driver's)."""
    with nvml() as pynvml:
        if pynvml is None:
            return None
        out: dict[int, int] = {}
        for d in devices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(d)
            used = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid]
            if not used or used[0] is None:
                return None
            out[d] = int(used[0])
        return out
    return None  # an NVML error, logged

"""A stage's `devices` are indices into the caller's visible GPUs (its CUDA_VISIBLE_DEVICES),
as in vLLM, torch and Ray, under MPS or not; the memory check reads the free memory of each
GPU now and names the processes holding it. On CPU: the environment each stage process gets,
and the memory check's logic over a stand-in for NVML (the real reader runs on GPU hosts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_mp.config.validate import parse_config
from omni_mp.control.memory_budget import GpuProcess, MemoryBudgetError, StageNeeds, plan_memory, read_devices
from omni_mp.control.mps import PIPE_ENV
from omni_mp.control.mps_guard import daemon_env
from omni_mp.control.stage_handle import stage_env
from omni_mp.utils.devices import DeviceError, visible_entries
from omni_mp.utils.gpu_memory import GiB

NEEDS = StageNeeds(weight_bytes=2 * GiB, weight_source="test", min_kv_bytes=GiB // 4, activation_bytes=GiB // 4)


def _pipeline(devices: list[int] | None = None, replica_devices: list[list[int]] | None = None, gib: float = 10):
    stage: dict = {"id": 0, "model": "tiny-qwen2", "final_output": True, "memory": {"gpu_gib": gib}}
    if replica_devices:
        stage |= {"replicas": len(replica_devices), "replica_devices": replica_devices}
    else:
        stage["devices"] = devices
    return parse_config({"name": "t", "stages": [stage]}, check_engine_args=False)


@pytest.mark.parametrize(
    ("caller", "devices", "seen"),
    [(None, [1], "1"), ("2,3", [0], "2"), ("2,3", [1], "3"), ("3,2", [0, 1], "3,2"), ("GPU-aa,GPU-bb", [1], "GPU-bb")],
)
def test_a_stage_gets_the_callers_gpu_at_its_index(caller: str | None, devices: list[int], seen: str) -> None:
    cfg = _pipeline(devices)
    base = {} if caller is None else {"CUDA_VISIBLE_DEVICES": caller}
    assert stage_env(cfg, cfg.stages[0], base=base)["CUDA_VISIBLE_DEVICES"] == seen
    # An MPS client too: the daemon sees every GPU (no CUDA_VISIBLE_DEVICES of its own), so the
    # caller's entry means the same GPU to a client as to a plain process.
    mps = stage_env(cfg, cfg.stages[0], base=base, mps_pipe="/tmp/x/pipe")
    assert mps["CUDA_VISIBLE_DEVICES"] == seen and mps[PIPE_ENV] == "/tmp/x/pipe"
    assert "CUDA_VISIBLE_DEVICES" not in daemon_env(Path("/tmp/x"))


def test_replicas_get_their_own_gpus_from_the_callers() -> None:
    cfg = _pipeline(replica_devices=[[0], [1]])
    base = {"CUDA_VISIBLE_DEVICES": "4,6"}
    assert [stage_env(cfg, s, base=base)["CUDA_VISIBLE_DEVICES"] for _, s in cfg.replica_stages()] == ["4", "6"]


def test_a_gpu_the_caller_does_not_see_is_refused_with_what_it_sees() -> None:
    cfg = _pipeline([2])
    with pytest.raises(DeviceError, match=r"devices \[2\] are not visible.*CUDA_VISIBLE_DEVICES='5,6'.*0\.\.1"):
        stage_env(cfg, cfg.stages[0], base={"CUDA_VISIBLE_DEVICES": "5,6"})
    with pytest.raises(DeviceError, match="shows 0 GPU"):
        visible_entries([0], {"CUDA_VISIBLE_DEVICES": ""})


class FakeNvml:
    """Four 80 GiB GPUs; GPU 2 half taken by another program."""

    def count(self) -> int:
        return 4

    def memory(self, index: int) -> tuple[int, int, str]:
        return 80 * GiB, (40 if index == 2 else 79) * GiB, f"GPU-{index}"

    def processes(self, index: int) -> list[GpuProcess]:
        return [GpuProcess(4242, "python train.py", 39 * GiB)] if index == 2 else []


def test_the_memory_check_reads_the_callers_gpu_and_names_who_holds_it() -> None:
    devices = read_devices(FakeNvml())
    plan = plan_memory(_pipeline([0], gib=30), devices, needs=lambda s: NEEDS, env={"CUDA_VISIBLE_DEVICES": "3"})
    assert plan.stages[0].gpus == [3]
    # devices: [0] under CUDA_VISIBLE_DEVICES=2 is GPU 2, where only 40 GiB are free now.
    with pytest.raises(MemoryBudgetError, match=r"device 2: .*> 40.00 GiB free now.*pid 4242 \(python train.py\) 39"):
        plan_memory(_pipeline([0], gib=50), devices, needs=lambda s: NEEDS, env={"CUDA_VISIBLE_DEVICES": "2"})
    by_uuid = plan_memory(
        _pipeline([1], gib=30), devices, needs=lambda s: NEEDS, env={"CUDA_VISIBLE_DEVICES": "GPU-0,GPU-1"}
    )
    assert by_uuid.stages[0].gpus == [1]


def test_every_replica_on_a_gpu_counts_against_it() -> None:
    devices = read_devices(FakeNvml())
    ok = plan_memory(_pipeline(replica_devices=[[0], [1]], gib=70), devices, needs=lambda s: NEEDS, env={})
    assert [(p.replica, p.gpus) for p in ok.stages] == [(0, [0]), (1, [1])]
    with pytest.raises(MemoryBudgetError, match=r"device 0: budgets stage 0 40.00 GiB \+ stage 0 replica 1 40.00 GiB"):
        plan_memory(_pipeline(replica_devices=[[0], [0]], gib=40), devices, needs=lambda s: NEEDS, env={})

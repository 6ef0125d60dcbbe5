"""GPU sharing (omni_mp.control.mps): which stages run as MPS clients, what their processes'
environment says, and how a daemon that cannot start is reported. The daemon itself needs an
NVIDIA GPU: tests/gpu/test_mps.py runs it on one (clients, equal outputs, nothing left after
a shutdown or a SIGKILLed coordinator)."""

from __future__ import annotations

import glob
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest

from omni_mp.config.schema import ConfigError
from omni_mp.config.validate import parse_config
from omni_mp.control.mps import (
    CONTROL,
    CONTROL_ENV,
    PIPE_ENV,
    PRIORITY_ENV,
    SM_PERCENT_ENV,
    MpsDaemon,
    MpsUnavailable,
    control_program,
    plan_sharing,
)
from omni_mp.control.stage_handle import stage_env
from omni_mp.wire.keys import generate


@pytest.fixture(scope="module")
def ray(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What a pipeline on Ray needs besides its placement: tcp and CURVE keys."""
    keys = tmp_path_factory.mktemp("keys")
    generate(keys, ["tester"])
    return {"placement": {"kind": "ray"}, "endpoints": {"transport": "tcp"}, "security": {"keys": str(keys)}}


def pipeline(devices: list[list[int]], **extra: Any) -> Any:
    stages: list[dict[str, Any]] = [
        {"id": 0, "model": "tiny-qwen2", "devices": devices[0]},
        {"id": 1, "model": "tiny-qwen2", "devices": devices[1], "inputs": [0], "processor": "continue_tokens"},
        {"id": 2, "model": "tiny-qwen2", "devices": devices[2], "inputs": [1], "processor": "continue_tokens",
         "final_output": True},
    ]  # fmt: skip
    return parse_config({"name": "t", "stages": stages, **extra}, check_engine_args=False)


def test_stages_that_share_a_gpu_become_clients_of_a_daemon_of_ours() -> None:
    one = plan_sharing(pipeline([[0], [0], [0]]), env={})
    assert one.stages == {0, 1, 2} and one.gpus == (0,) and one.needs_daemon
    # the two-GPU layout: the thinker has GPU 0 to itself; talker and vocoder share GPU 1
    two = plan_sharing(pipeline([[0], [1], [1]]), env={})
    assert two.stages == {1, 2} and two.gpus == (1,) and "GPU 1: stages 1, 2" in two.why
    # a stage on two GPUs, one of them shared, is a client too (the daemon serves every GPU)
    assert plan_sharing(pipeline([[0, 1], [1], [2]]), env={}).stages == {0, 1}


@pytest.mark.parametrize(
    ("devices", "extra", "why"),
    [
        ([[0], [1], [2]], {}, "no GPU is shared"),
        ([[], [], []], {}, "no GPU is shared"),
        ([[0], [0], [0]], {"gpu_sharing": {"mode": "time_slice"}}, "gpu_sharing: time_slice"),
        ([[0], [0], [0]], "ray", "placement ray"),
    ],
)
def test_no_mps_without_a_shared_gpu_or_when_the_config_says_so(
    devices: list[list[int]], extra: dict[str, Any] | str, why: str, ray: dict[str, Any]
) -> None:
    plan = plan_sharing(pipeline(devices, **(ray if extra == "ray" else extra)), env={})
    assert not plan.stages and not plan.needs_daemon and why in plan.why


def test_a_daemon_the_environment_names_is_used_instead_of_starting_one() -> None:
    plan = plan_sharing(pipeline([[0], [0], [0]]), env={PIPE_ENV: "/run/site-mps"})
    assert plan.host_pipe == "/run/site-mps" and not plan.needs_daemon


def test_config_refuses_mps_with_ray_and_unknown_modes_by_name(ray: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="gpu_sharing.mode.*'mps'.*ray"):
        pipeline([[0], [0], [0]], gpu_sharing={"mode": "mps"}, **ray)
    with pytest.raises(ConfigError, match="gpu_sharing.mode"):
        pipeline([[0], [0], [0]], gpu_sharing={"mode": "exclusive"})


def test_stage_environment_names_its_daemon() -> None:
    cfg = pipeline([[0], [0], [0]])
    assert stage_env(cfg, cfg.stages[0], base={}, mps_pipe="/tmp/omni-mps-x/pipe")[PIPE_ENV] == "/tmp/omni-mps-x/pipe"
    assert PIPE_ENV not in stage_env(cfg, cfg.stages[0], base={})
    # auto keeps a daemon the user's environment names; time_slice opts out of it
    assert stage_env(cfg, cfg.stages[0], base={PIPE_ENV: "/run/site-mps"})[PIPE_ENV] == "/run/site-mps"
    sliced = pipeline([[0], [0], [0]], gpu_sharing={"mode": "time_slice"})
    assert PIPE_ENV not in stage_env(sliced, sliced.stages[0], base={PIPE_ENV: "/run/site-mps"})


def test_a_stage_with_slack_can_yield_its_gpu_under_mps() -> None:
    raw: list[dict[str, Any]] = [
        {"id": 0, "model": "tiny-qwen2", "devices": [0]},
        {"id": 1, "model": "tiny-qwen2", "devices": [0], "inputs": [0], "processor": "continue_tokens",
         "final_output": True, "mps_priority": "below_normal"},
    ]  # fmt: skip
    cfg = parse_config({"name": "t", "stages": raw}, check_engine_args=False)
    assert plan_sharing(cfg, env={}).why == "GPU 0: stages 0, 1; below normal priority: stage 1"
    # every GPU stage says its level, so one inherited from the caller's environment never applies
    assert stage_env(cfg, cfg.stages[0], base={PRIORITY_ENV: "1"})[PRIORITY_ENV] == "0"
    assert stage_env(cfg, cfg.stages[1], base={}, mps_pipe="/tmp/omni-mps-x/pipe")[PRIORITY_ENV] == "1"
    cpu = [{**raw[0], "devices": []}, {**raw[1], "devices": []}]
    with pytest.raises(ConfigError, match=r"stages\[1\]\.mps_priority.*no `devices`"):
        parse_config({"name": "t", "stages": cpu}, check_engine_args=False)
    with pytest.raises(ConfigError, match="mps_priority"):
        parse_config({"name": "t", "stages": [raw[0], {**raw[1], "mps_priority": "high"}]}, check_engine_args=False)


def test_a_stage_can_hold_a_share_of_the_sms_under_mps() -> None:
    raw: list[dict[str, Any]] = [
        {"id": 0, "model": "tiny-qwen2", "devices": [0], "mps_sm_percent": 70},
        {"id": 1, "model": "tiny-qwen2", "devices": [0], "inputs": [0], "processor": "continue_tokens",
         "final_output": True},
    ]  # fmt: skip
    cfg = parse_config({"name": "t", "stages": raw}, check_engine_args=False)
    assert plan_sharing(cfg, env={}).why == "GPU 0: stages 0, 1; SM shares: stage 0 70%"
    assert stage_env(cfg, cfg.stages[0], base={})[SM_PERCENT_ENV] == "70"
    # a share in the caller's environment is not passed on to a stage that sets none
    assert SM_PERCENT_ENV not in stage_env(cfg, cfg.stages[1], base={SM_PERCENT_ENV: "20"})
    for bad in (0, 101):
        with pytest.raises(ConfigError, match=r"stages\[0\]\.mps_sm_percent"):
            parse_config({"name": "t", "stages": [{**raw[0], "mps_sm_percent": bad}, raw[1]]}, check_engine_args=False)
    cpu = [{**raw[0], "devices": []}, {**raw[1], "devices": []}]
    with pytest.raises(ConfigError, match=r"stages\[0\]\.mps_sm_percent.*no `devices`"):
        parse_config({"name": "t", "stages": cpu}, check_engine_args=False)


def test_no_control_program_is_named_in_the_error() -> None:
    with pytest.raises(MpsUnavailable, match=f"{CONTROL} is not on PATH"):
        control_program(env={"PATH": "/nonexistent"})


def test_a_daemon_that_exits_at_once_is_reported_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A control program that exits instead of serving (here `false`, as a broken driver
    install would): the error names it and its exit code; the guard process is gone, and so
    is the daemon's directory."""
    monkeypatch.setenv(CONTROL_ENV, "/bin/false")
    pattern = str(Path(tempfile.gettempdir()) / "omni-mps-*")
    before = set(glob.glob(pattern))
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(MpsUnavailable, match=r"/bin/false did not start: /bin/false -f exited with code 1"):
        MpsDaemon.start(tmp_path / "guard.log")
    assert set(glob.glob(pattern)) == before
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in children and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(
    ("control", "said"),
    [(None, f"{CONTROL} is not on PATH"), ("/bin/false", "/bin/false -f exited with code 1")],
)
def test_mode_mps_without_a_daemon_fails_start_up_before_any_stage(
    control: str | None, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpu_sharing: mps` and no daemon: start() fails naming why, no stage was spawned, and
    the coordinator's sockets and processes are gone."""
    from omni_mp.control.coordinator import Coordinator, StartupError

    monkeypatch.delenv(PIPE_ENV, raising=False)
    if control is None:
        monkeypatch.delenv(CONTROL_ENV, raising=False)
        monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # python, without the MPS program
    else:
        monkeypatch.setenv(CONTROL_ENV, control)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    coord = Coordinator(pipeline([[0], [0], [0]], gpu_sharing={"mode": "mps"}))
    with pytest.raises(StartupError, match=f"gpu_sharing: mps: .*{said}"):
        coord.start()
    assert all(h.pid is None for h in coord.stages.values())
    assert coord.mps is None and coord._closed
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in children and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE]

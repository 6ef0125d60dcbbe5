"""Supervision without engines: a stage process that hangs before it is ready, children
forked from short-lived threads, and a launcher whose coordinator thread dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from omni_mp import cli as launch
from omni_mp.config.validate import parse_config
from omni_mp.control.coordinator import Coordinator
from omni_mp.control.endpoints import RunEndpoints, new_run_id
from omni_mp.control.router import ReplicaKey
from omni_mp.control.stage_handle import StageHandle
from omni_mp.control.supervisor import Supervisor
from omni_mp.utils.procs import popen
from tests.launcher import REPO, gone


def test_a_stage_that_hangs_before_it_is_ready_is_killed(tmp_path: Path) -> None:
    """Today's start-up path: the (re)started stage is stopped while it loads; nothing else
    watches a stage that is not ready yet, so the start-up deadline must."""
    cfg = parse_config(
        {
            "name": "p",
            "timeouts": {"stage_startup_s": 2, "heartbeat_timeout_s": 1},
            "stages": [{"id": 0, "model": "tiny-qwen2", "final_output": True}],
        },
        check_engine_args=False,
    )
    h = StageHandle(cfg, cfg.stages[0], "ipc://@nobody-listens", RunEndpoints(cfg.endpoints, new_run_id()), tmp_path)
    said: list[str] = []
    sup = Supervisor(cfg, {ReplicaKey(0, 0): h}, said.append)
    h.spawn()
    pid = h.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert sup.check(t0, set()) == []
        # A stage that has sent a heartbeat while starting is held to the heartbeat timeout.
        sup.heartbeat(ReplicaKey(0, 0), t0)
        assert sup.check(t0 + 0.5, set()) == []
        t_check = time.monotonic()
        deaths = sup.check(t0 + 1.5, set())
        assert time.monotonic() - t_check < 1.0, "the supervisor waited for the kill to complete"
        assert [key.stage_id for key, _ in deaths] == [0] and "no heartbeat for 1.5s" in deaths[0][1]
        assert gone(pid)
        assert "will not be restarted" in said[-1]
        # A silent one is held to the start-up deadline.
        h.spawn()
        pid = h.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        assert h.run is not None
        spawned_at = h.run.spawned_at
        assert sup.check(spawned_at + 1.0, set()) == []
        deaths = sup.check(spawned_at + 2.5, set())
        assert [key.stage_id for key, _ in deaths] == [0] and "not ready 2s after it started" in deaths[0][1]
    finally:
        h.kill()


def _killed_death(sup: Supervisor, h: StageHandle, now: float) -> list[tuple[int, str]]:
    """SIGKILL the stage's current run and let the supervisor find it dead."""
    pid = h.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not (deaths := sup.check(now, set())):
        assert time.monotonic() < deadline, "the killed stage was not found dead"
        time.sleep(0.05)
    return deaths


@pytest.mark.parametrize("when_spent", ["stop", "retry"])
def test_a_spent_restart_budget_stops_the_stage_or_keeps_retrying(tmp_path: Path, when_spent: str) -> None:
    backoff = 0.5
    cfg = parse_config(
        {
            "name": "p",
            "stages": [
                {
                    "id": 0,
                    "model": "tiny-qwen2",
                    "final_output": True,
                    "restart": {"max_restarts": 1, "backoff_s": backoff, "when_spent": when_spent},
                }
            ],
        },
        check_engine_args=False,
    )
    h = StageHandle(cfg, cfg.stages[0], "ipc://@nobody-listens", RunEndpoints(cfg.endpoints, new_run_id()), tmp_path)
    said: list[str] = []
    sup = Supervisor(cfg, {ReplicaKey(0, 0): h}, said.append)
    h.spawn()
    try:
        t0 = time.monotonic()
        _killed_death(sup, h, t0)  # within the budget: restarted after the back-off
        assert h.restart_at == t0 + backoff and sup.down_for_good() == {}
        assert sup.check(t0 + backoff, set()) == [] and h.restarts == 1 and h.pid is not None
        deaths = _killed_death(sup, h, t0 + 1)  # the budget is spent
        if when_spent == "stop":
            assert h.restart_at is None and sup.down_for_good() == {0: deaths[0][1]}
            assert "will not be restarted" in said[-1]
        else:  # restarted again, the back-off doubled
            assert h.restart_at == t0 + 1 + 2 * backoff and sup.down_for_good() == {}
            assert sup.check(t0 + 1 + 2 * backoff, set()) == [] and h.restarts == 2 and h.pid is not None
    finally:
        h.kill()


CHILD = (
    "import sys, time; from omni_mp.utils.procs import die_with_parent; die_with_parent(int(sys.argv[1])); "
    "time.sleep(60)"
)


def test_children_forked_from_a_short_lived_thread_outlive_it() -> None:
    """PR_SET_PDEATHSIG is per thread: the child would get SIGKILL when the forking thread ends."""
    procs: list[subprocess.Popen[bytes]] = []
    cmd = [sys.executable, "-c", CHILD, str(os.getpid())]
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def handler() -> None:  # forks, lives on while the child sets PR_SET_PDEATHSIG, then ends
        procs.append(popen(cmd, cwd=REPO, env=env))
        time.sleep(2.5)

    t = threading.Thread(target=handler)
    t.start()
    t.join()
    try:
        time.sleep(1.0)
        assert procs[0].poll() is None, f"the child died with its forking thread (code {procs[0].poll()})"
    finally:
        procs[0].kill()
        procs[0].wait()


def test_the_launcher_exits_if_the_coordinator_thread_dies(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Coordinator, now: float) -> None:
        raise RuntimeError("a bug in the coordinator loop")

    monkeypatch.setattr(Coordinator, "start", lambda self: None)  # no engines: the loop itself fails
    monkeypatch.setattr(Coordinator, "_supervise", broken)
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    # Before the fix the launcher waits forever: a SIGINT after 20 s ends it with status 0.
    rescue = threading.Timer(20, lambda: os.kill(os.getpid(), signal.SIGINT))
    rescue.start()
    try:
        t0 = time.monotonic()
        code = launch.main(["--config", str(REPO / "tests/configs/tiny_single.yaml")])
    finally:
        rescue.cancel()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert code == 4 and time.monotonic() - t0 < 15

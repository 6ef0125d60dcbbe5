"""Restart budgets with real processes: a stage killed (SIGKILL) within its budget comes back;
killed once more with the budget spent it is down for good, which `status()` says (`failed`,
with why), every later request is refused, and a served launcher exits non-zero."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from omni_mp.cli import EXIT_STAGE_DOWN
from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.config.validate import parse_config
from omni_mp.control.coordinator import Coordinator
from omni_mp.wire.messages import StatusReply
from tests.launcher import REPO, gone, serve

pytestmark = pytest.mark.engine

SINGLE = REPO / "tests" / "configs" / "tiny_single.yaml"


def config_with_budget(max_restarts: int) -> dict:
    cfg = yaml.safe_load(SINGLE.read_text())
    cfg["stages"][0]["restart"] = {"max_restarts": max_restarts, "backoff_s": 0.2, "when_spent": "stop"}
    return cfg


def wait_for(client: OmniClient, what: str, ok: object, timeout_s: float = 300) -> StatusReply:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.status()
        if ok(status):  # type: ignore[operator]
            return status
        assert time.monotonic() < deadline, f"{what}: {status}"
        time.sleep(0.1)


def kill_stage(client: OmniClient) -> int:
    pid = client.status().stages[0].pid
    os.kill(pid, signal.SIGKILL)
    assert gone(pid)
    return pid


def test_status_says_which_stage_is_down_for_good() -> None:
    coord = Coordinator(parse_config(config_with_budget(0)))
    coord.start()
    runner = threading.Thread(target=coord.run, name="coordinator")
    runner.start()
    try:
        with OmniClient(coord.client_endpoint) as client:
            assert client.generate("Hello", deadline_s=120).outputs[0].token_ids
            assert client.status().stages[0].failed is None
            pid = kill_stage(client)
            status = wait_for(client, "never marked failed", lambda s: s.stages[0].failed is not None)
            stage = status.stages[0]
            assert not stage.alive and not stage.ready and stage.restarts == 0
            assert stage.failed.startswith(f"stage 0 (pid {pid}) died with exit code -9")
            assert coord.down_for_good() == {0: stage.failed}
            with pytest.raises(RequestError) as err:
                client.generate("Hello", deadline_s=60)
            assert err.value.event.code == "stage_unavailable"
    finally:
        coord.stop()
        runner.join(60)


def test_a_served_pipeline_exits_non_zero_once_a_stage_is_down_for_good(tmp_path: Path) -> None:
    config = tmp_path / "budget.yaml"
    config.write_text(yaml.safe_dump(config_with_budget(1)))
    with serve(config) as served, OmniClient(served.endpoint) as client:
        want = client.generate("Hello", deadline_s=120).outputs[0].token_ids
        first = kill_stage(client)  # within the budget: restarted, and serving again
        wait_for(client, "not restarted", lambda s: s.stages[0].restarts == 1 and s.stages[0].ready)
        assert client.status().stages[0].pid != first
        assert client.generate("Hello", deadline_s=120).outputs[0].token_ids == want
        children = served.descendants()
        kill_stage(client)  # the budget is spent
        code = served.proc.wait(30)
        assert code == EXIT_STAGE_DOWN, "".join(served.lines[-20:])
        out = "".join(served.lines)
        assert "error: stage 0 is down for good (restart budget spent): stage 0 (pid" in out
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"processes outlived the launcher: {alive}"

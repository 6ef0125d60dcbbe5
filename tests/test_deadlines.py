"""Deadlines cross processes as relative budgets: the coordinator sends the seconds left by its
own monotonic clock, and a stage adds them to its own, so no two hosts' clocks need agree.
(The deadline's effect end to end is covered by the pipeline tests' deadline_exceeded cases.)"""

from __future__ import annotations

import os
import time

import pytest

from omni_mp.config.validate import parse_config
from omni_mp.control.coordinator import Coordinator
from omni_mp.control.links import StageLink
from omni_mp.control.router import ReplicaKey
from omni_mp.wire.codec import PayloadError, decode, encode
from omni_mp.wire.messages import StageRequest, Submit
from omni_mp.wire.transport import MessageReceiver, MessageSender


def test_a_stage_request_carries_the_seconds_left_not_a_clock_reading() -> None:
    stages = [{"id": 0, "model": "tiny-qwen2", "final_output": True}]
    cfg = parse_config({"name": "t", "stages": stages}, check_engine_args=False)
    coord = Coordinator(cfg)  # not started: the test plays its one stage
    endpoint = f"ipc://@omni_mp-test-deadline-{os.getpid()}"
    stage_input = MessageReceiver(coord.ctx, endpoint, cfg.limits)
    try:
        coord.links[ReplicaKey(0, 0)] = StageLink(
            MessageSender(coord.ctx, endpoint, cfg.limits), cfg.limits, max_queue=8
        )
        msg = Submit(request_id="r", prompt="hi", deadline_s=30.0)
        req = coord.table.admit(b"client", msg, time.time(), msg.deadline_s, {0})
        req.route = {0: 0}  # what the router binds at admission
        before = time.monotonic()
        coord._register(req, msg, {}, before + 30.0)  # what admission does, by the coordinator's clock
        got = stage_input.recv(timeout=5)
        waited = time.monotonic() - before
        assert isinstance(got, StageRequest) and got.deadline_s is not None
        assert 30.0 - waited <= got.deadline_s <= 30.0
    finally:
        stage_input.close()
        coord.shutdown()


@pytest.mark.parametrize("seconds", [time.time(), -1.0, float("nan")])
def test_a_clock_reading_is_refused_as_a_deadline(seconds: float) -> None:
    """A unix time (or a negative or NaN budget) on the wire is refused while decoding."""
    frames = encode(StageRequest(request_id="r", stage_id=0, deadline_s=seconds))
    with pytest.raises(PayloadError, match="deadline_s"):
        decode(frames)

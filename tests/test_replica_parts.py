"""Stage replicas without engines: the YAML keys and their checks, the router's rule, and the
replica label of /metrics. (Replicas of real engines: tests/test_replicas_*.py, test_ray.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from omni_mp.config.schema import ConfigError
from omni_mp.config.validate import parse_config
from omni_mp.control.router import NoReplica, ReplicaKey, Router
from omni_mp.http.app import health_of
from omni_mp.http.metrics import Metrics
from omni_mp.http.pipeline import PipelineView
from omni_mp.stage.loop import link_pools
from omni_mp.wire.messages import StageStats, StageStatus, StatusReply


def _cfg(**talker: Any) -> Any:
    return parse_config(
        {
            "name": "t",
            "stages": [
                {"id": 0, "model": "tiny-qwen2", "final_output": True},
                {"id": 1, "model": "tiny-qwen2-b", "inputs": [0], "processor": "continue_tokens", **talker},
                {"id": 2, "model": "tiny-qwen2-b", "inputs": [1], "processor": "continue_tokens", "final_output": True,
                 "replicas": 3},
            ],
        },
        check_engine_args=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("talker", "needle"),
    [
        ({"replicas": 0}, r">= 1 - at `stages\[1\].replicas`"),
        ({"replicas": 65}, r"<= 64 - at `stages\[1\].replicas`"),
        ({"replicas": 2, "replica_devices": [[0]]}, r"1 device lists for `replicas: 2`"),
        ({"replicas": 2, "replica_devices": [[0], [1, 2]]}, r"same number of GPUs"),
        ({"replicas": 2, "replica_devices": [[0], []]}, r"same number of GPUs"),
        ({"replicas": 2, "replica_devices": [[0], [1]], "devices": [0]}, r"`devices` .* or this, not both"),
        ({"replicas": 2, "replica_devices": [[0], [1, 1]]}, r"same number|distinct"),
        ({"replicas": 2, "replica_ray_resources": [{}, {}]}, r"only with `placement.kind: ray`"),
    ],
)
def test_bad_replica_keys_are_refused_naming_the_key(talker: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _cfg(**talker)


def test_each_replica_has_its_own_devices() -> None:
    cfg = _cfg(replicas=2, replica_devices=[[0], [1]])
    assert [(s.id, r, s.devices) for r, s in cfg.replica_stages()] == [
        (0, 0, []), (1, 0, [0]), (1, 1, [1]), (2, 0, []), (2, 1, []), (2, 2, []),
    ]  # fmt: skip
    shared = _cfg(replicas=2, devices=[0])  # several replicas on one GPU (MPS clients)
    assert [s.devices for _, s in shared.replica_stages() if s.id == 1] == [[0], [0]]


class Fleet:
    """What the coordinator tells the router: which replicas serve, their links, their heartbeats."""

    def __init__(self) -> None:
        self.down: set[ReplicaKey] = set()
        self.unlinked: set[tuple[ReplicaKey, ReplicaKey]] = set()
        self.load: dict[ReplicaKey, int] = {}

    def router(self, cfg: Any) -> Router:
        return Router(
            cfg,
            lambda k: k not in self.down,
            lambda up, down: (up, down) not in self.unlinked,
            lambda k: self.load.get(k, 0),
        )


def test_the_router_binds_by_outstanding_then_heartbeat_then_round_robin() -> None:
    cfg, fleet = _cfg(replicas=2), Fleet()
    router = fleet.router(cfg)
    # Equal loads: round robin from the replica after the last one chosen.
    routes = [router.bind() for _ in range(6)]
    assert [r[1] for r in routes] == [0, 1, 0, 1, 0, 1]
    assert [r[2] for r in routes] == [0, 1, 2, 0, 1, 2]
    assert router.outstanding[ReplicaKey(2, 0)] == 2 and router.outstanding[ReplicaKey(1, 1)] == 3
    # A replica with fewer outstanding requests wins, whatever the rotation says.
    for _ in range(3):
        router.release(ReplicaKey(1, 1))
    assert router.bind()[1] == 1
    # Equal outstanding counts: the lighter heartbeat (running + waiting) wins.
    cfg2 = _cfg(replicas=2)
    fleet.load = {ReplicaKey(1, 0): 5, ReplicaKey(1, 1): 0}
    fresh = fleet.router(cfg2)
    assert [fresh.bind()[1] for _ in range(2)] == [1, 0]  # then outstanding 1 vs 0 decides


def test_the_router_never_binds_a_replica_that_is_down_or_unlinked() -> None:
    cfg, fleet = _cfg(replicas=2), Fleet()
    router = fleet.router(cfg)
    fleet.down = {ReplicaKey(1, 0)}
    assert {router.bind()[1] for _ in range(4)} == {1}
    # Stage 2's replica 0 is not linked from talker replica 1: never chosen behind it.
    fleet.unlinked = {(ReplicaKey(1, 1), ReplicaKey(2, 0))}
    assert {router.bind()[2] for _ in range(6)} == {1, 2}
    fleet.down |= {ReplicaKey(1, 1)}
    with pytest.raises(NoReplica, match=r"stage 1: none of its 2 replica\(s\) is serving"):
        router.bind()


def test_metrics_carry_the_replica_label() -> None:
    cfg = _cfg(replicas=2)
    metrics = Metrics(PipelineView.of(cfg))
    stats = StageStats(running=3, waiting=1, steps=10)
    status = StatusReply(
        pipeline="t",
        inflight=4,
        stages=[
            StageStatus(stage_id=1, replica=r, pid=100 + r, alive=r == 0, ready=r == 0, restarts=r, stats=stats)
            for r in range(2)
        ],
    )
    text = metrics.render(status).decode()
    assert 'omni_mp_stage_ready{replica="0",stage_id="1",stage_name="ar"} 1.0' in text
    assert 'omni_mp_stage_ready{replica="1",stage_id="1",stage_name="ar"} 0.0' in text
    assert 'omni_mp_stage_restarts{replica="1",stage_id="1",stage_name="ar"} 1.0' in text
    assert 'omni_mp_stage_requests_running{replica="1",stage_id="1",stage_name="ar"} 3.0' in text


def test_links_to_a_replicated_stage_split_its_shared_memory_pool() -> None:
    """Every upstream replica links to every downstream one, and each pool is prefaulted: a
    link to one of R replicas gets 1/R of `endpoints.shm`, so R replicas pin no more."""
    cfg = _cfg(replicas=2)
    base = cfg.endpoints.shm
    assert link_pools(cfg, 0)[1].capacity_bytes == base.capacity_bytes // 2
    assert link_pools(cfg, 1)[2].capacity_bytes == base.capacity_bytes // 3
    assert link_pools(cfg, 1)[2].threshold_bytes == base.threshold_bytes
    assert link_pools(cfg, 2) == {}


def test_health_is_ok_while_every_stage_has_a_serving_replica() -> None:
    def status(*up: tuple[int, int, bool]) -> StatusReply:
        return StatusReply(
            pipeline="t",
            inflight=0,
            stages=[StageStatus(stage_id=s, replica=r, pid=1, alive=ok, ready=ok, restarts=0) for s, r, ok in up],
        )

    body, code = health_of(status((0, 0, True), (1, 0, True), (1, 1, False)))
    assert code == 200 and body["status"] == "ok" and body["degraded"] == "stage 1 replica 1 (down, restarting)"
    assert [(s["stage_id"], s["replica"]) for s in body["stages"]] == [(0, 0), (1, 0), (1, 1)]
    body, code = health_of(status((0, 0, True), (1, 0, False), (1, 1, False)))
    assert (
        code == 503
        and body["reason"] == "not serving: stage 1 (down, restarting), stage 1 replica 1 (down, restarting)"
    )
    assert "degraded" not in health_of(status((0, 0, True)))[0]

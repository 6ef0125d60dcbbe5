"""placement: ray — the tiny chain across a local two-node Ray cluster (two raylets on this
machine, every address on 127.0.0.1), stages talking ZMQ over TCP with CURVE keys:
token-exact against transformers (the same oracle as the single-host run), each stage on
its own node, and a node removed mid-request: the request fails within the heartbeat bound,
the stage is re-placed on the surviving node, and the next request is exact again."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.config.validate import parse_config
from omni_mp.control.embedded import embedded_pipeline
from omni_mp.wire.keys import client_identity, generate
from omni_mp.wire.messages import SamplingParamsMsg
from tests.hf_oracle import assert_same_tokens
from tests.test_pipeline import N0, N1, chain_oracle

pytestmark = [pytest.mark.engine, pytest.mark.ray]

ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048, "max_num_seqs": 8, "seed": 0}
SAMPLING = {"temperature": 0.0, "ignore_eos": True}
PROMPT = "Hello world, how are you?"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from omni_mp.control.ray_local import local_cluster  # ray: the `ray` extra, installed by scripts/setup.sh

    # The stage processes the actors start must import this checkout (as CI's editable install does).
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    # The stages' logs go under pytest's temp dir, not the default /tmp/omni_mp-ray-logs on each node.
    logs = tmp_path_factory.mktemp("ray-stage-logs")
    before = os.environ.get("OMNI_MP_RAY_LOG_DIR")
    os.environ["OMNI_MP_RAY_LOG_DIR"] = str(logs)
    try:
        with local_cluster(nodes=2) as c:
            yield c
    finally:
        if before is None:
            os.environ.pop("OMNI_MP_RAY_LOG_DIR", None)
        else:
            os.environ["OMNI_MP_RAY_LOG_DIR"] = before
    assert list(logs.glob("omni_mp-ray-logs/*.log")), "the stages logged elsewhere"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    generate(d, ["tester"])
    return d


def chain(
    cluster: Any, keys: Path, *, pin_talker: bool = True, talker: dict[str, Any] | None = None, **placement: Any
) -> Any:
    stages: list[dict[str, Any]] = [
        {"id": 0, "model": "tiny-qwen2", "engine_args": ENGINE, "sampling": {**SAMPLING, "max_tokens": N0}},
        {
            "id": 1,
            "model": "tiny-qwen2-b",
            "inputs": [0],
            "processor": "continue_tokens",
            "final_output": True,
            "engine_args": ENGINE,
            "sampling": {**SAMPLING, "max_tokens": N1},
            "restart": {"max_restarts": 2, "backoff_s": 0.5},
        },
    ]
    stages[0]["ray_resources"] = {"node_a": 0.01}  # the head node
    if pin_talker:
        stages[1]["ray_resources"] = {"node_b": 0.01}
    stages[1].update(talker or {})
    return parse_config(
        {
            "name": "ray_chain",
            "placement": {"kind": "ray", "address": cluster.address, **placement},
            "endpoints": {"transport": "tcp", "host": "127.0.0.1"},
            "security": {"keys": str(keys)},
            "timeouts": {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 3.0},
            "stages": stages,
        }
    )


def kill_node(cluster: Any, node: Any) -> None:
    """What a host failure does: every process of the node dies at once (its raylet and all
    the workers under it, the stage's actor and the stage process too), then Ray drops it."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    doomed = [raylet, *raylet.children(recursive=True)]
    for proc in doomed:
        proc.kill()
    psutil.wait_procs(doomed, timeout=10)
    cluster.remove_node(node, allow_graceful=False)


def test_the_chain_across_two_nodes_matches_transformers(cluster: Any, keys: Path) -> None:
    want, margins = chain_oracle(PROMPT)
    with embedded_pipeline(chain(cluster, keys)) as coord:
        with OmniClient(coord.client_endpoint, keys=client_identity(keys, "tester")) as client:
            status = client.status()
            nodes = {s.stage_id: s.info.get("node") for s in status.stages}
            assert nodes[0] and nodes[1] and nodes[0] != nodes[1], f"stages not on two nodes: {nodes}"
            assert all(s.info["input"].startswith("tcp://127.0.0.1:") for s in status.stages)
            for _ in range(2):
                done = client.generate(PROMPT, timeout_s=120)
                assert_same_tokens(done.outputs[-1].token_ids, want, margins, "chain across two Ray nodes")


def test_replicas_of_a_stage_on_two_nodes_each_match_transformers(cluster: Any, keys: Path) -> None:
    """Stage 1 in two replicas, one per node: each request is bound to one, and both answer
    token-exact (every replica of stage 0 links to every replica of stage 1 over TCP)."""
    want, margins = chain_oracle(PROMPT)
    replicas = {"replicas": 2, "replica_ray_resources": [{"node_a": 0.01}, {"node_b": 0.01}]}
    with embedded_pipeline(chain(cluster, keys, pin_talker=False, talker=replicas)) as coord:
        with OmniClient(coord.client_endpoint, keys=client_identity(keys, "tester")) as client:
            nodes = {(s.stage_id, s.replica): s.info.get("node") for s in client.status().stages}
            assert nodes[(1, 0)] and nodes[(1, 1)] and nodes[(1, 0)] != nodes[(1, 1)], nodes
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                runs = list(pool.map(lambda _: client.generate(PROMPT, timeout_s=120), range(2)))
            for done in runs:
                assert_same_tokens(done.outputs[-1].token_ids, want, margins, "a replica on another node")
            assert sorted(next(d.replica for d in r.stage_timings if d.stage_id == 1) for r in runs) == [0, 1]


def test_a_lost_node_fails_its_requests_and_the_stage_moves(cluster: Any, keys: Path) -> None:
    want, margins = chain_oracle(PROMPT)
    # The thinker pinned to the head node, the talker spread away from it but free to move.
    cfg = chain(cluster, keys, strategy="SPREAD", pin_talker=False)
    with embedded_pipeline(cfg) as coord:
        with OmniClient(coord.client_endpoint, keys=client_identity(keys, "tester")) as client:
            victim_node = client.status().stages[1].info["node"]
            victim = next(n for n in cluster.list_all_nodes() if n.node_id[:12] in victim_node)
            assert victim is not cluster.head_node, "SPREAD placed both stages on the head node"
            long = {0: SamplingParamsMsg(max_tokens=1500, ignore_eos=True)}
            stream = client.stream(PROMPT, sampling=long, timeout_s=120)
            next(stream)  # running
            t0 = time.monotonic()
            kill_node(cluster, victim)
            with pytest.raises(RequestError) as err:
                list(stream)
            waited = time.monotonic() - t0
            print(f"[ray] the request failed {waited:.1f}s after its node was killed")
            assert err.value.event.code == "stage_died", err.value
            assert waited < 2 * cfg.timeouts.heartbeat_timeout_s + 2, f"failed after {waited:.1f}s"
            # The restart policy starts a new actor; Ray re-places its bundle on the node left.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                status = client.status()
                stage = status.stages[1]
                # ... and stage 0 linked to it again (its Connected follows stage 1's Ready)
                if all(s.ready for s in status.stages) and stage.info.get("node") != victim_node:
                    break
                time.sleep(0.5)
            else:
                raise AssertionError(f"stage 1 was not re-placed: {client.status().stages[1]}")
            print(f"[ray] stage 1 serving again on {stage.info['node']} {time.monotonic() - t0:.1f}s after the kill")
            done = client.generate(PROMPT, timeout_s=120)
            assert_same_tokens(done.outputs[-1].token_ids, want, margins, "after the stage moved")

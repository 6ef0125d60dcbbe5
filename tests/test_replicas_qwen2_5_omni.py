"""Qwen2.5-Omni with its talker and token2wav each in two replicas (the shipped tiny pipeline,
`replicas: 2` on stages 1 and 2; five processes): every request equals transformers on the
same checkpoint, as with one replica (the oracle of test_qwen2_5_omni_pipeline); requests
spread over the replicas by load; a talker replica killed with SIGKILL mid-stream fails only
the request bound to it, the others keep serving meanwhile, and it comes back and serves again."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.launcher import ServedPipeline, serve, settled_client, with_replicas
from tests.test_qwen2_5_omni_pipeline import check_against_transformers
from tests.test_restart_budget import wait_for

pytestmark = pytest.mark.engine

TEXT = "Tell me a short story about the sea."


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedPipeline]:
    config = with_replicas(CONFIG_DIR / "tiny_qwen2_5_omni.yaml", tmp_path_factory.mktemp("replicas"), {1: 2, 2: 2})
    with serve(config) as served:
        yield served


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


def replicas_of(done: Finished, stage_id: int) -> int:
    return next(d.replica for d in done.stage_timings if d.stage_id == stage_id)


def test_every_request_equals_transformers_and_the_replicas_share_them(client: OmniClient) -> None:
    status = client.status()
    assert [(s.stage_id, s.replica) for s in status.stages] == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(s.alive and s.ready for s in status.stages)
    jobs = [("Chelsie", 100), ("Ethan", 101), ("Chelsie", 102), ("Ethan", 103)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futs = [
            pool.submit(client.generate, TEXT, speaker=spk, sampling={2: SamplingParamsMsg(seed=seed)}, deadline_s=600)
            for spk, seed in jobs
        ]
        results = [f.result() for f in futs]
    for (spk, seed), done in zip(jobs, results, strict=True):
        check_against_transformers(done, TEXT, speaker=spk, seed=seed)
    # Four requests at once over two idle replicas: the least outstanding takes each, two apiece.
    for sid in (1, 2):
        bound = sorted(replicas_of(done, sid) for done in results)
        assert bound == [0, 0, 1, 1], f"stage {sid}: replicas {bound}"


def test_kill_9_of_a_talker_replica_fails_only_its_request(client: OmniClient) -> None:
    results: dict[int, Finished | RequestError] = {}
    talking = [threading.Event(), threading.Event()]

    def run(i: int) -> None:
        try:
            for ev in client.stream(TEXT, deadline_s=600):
                if isinstance(ev, StageOutputChunk) and ev.stage_id == 1:
                    talking[i].set()  # its talker replica streams codes
                if isinstance(ev, Finished):
                    results[i] = ev
        except RequestError as err:
            results[i] = err
        talking[i].set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for ev in talking:
        assert ev.wait(300), "a request never reached its talker"
    status = client.status()
    victim = next(s for s in status.stages if (s.stage_id, s.replica) == (1, 1))
    os.kill(victim.pid, signal.SIGKILL)
    for t in threads:
        t.join(600)
    failed = [r for r in results.values() if isinstance(r, RequestError)]
    finished = [r for r in results.values() if isinstance(r, Finished)]
    assert len(failed) == 1 and len(finished) == 1, results
    assert failed[0].code == "stage_died" and "stage 1 replica 1" in str(failed[0]), failed[0]
    assert replicas_of(finished[0], 1) == 0
    check_against_transformers(finished[0], TEXT)
    # While it restarts, its stage serves on the other replica.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        meanwhile = list(pool.map(lambda _: client.generate(TEXT, deadline_s=600), range(2)))
    assert [replicas_of(done, 1) for done in meanwhile] == [0, 0]
    check_against_transformers(meanwhile[0], TEXT)
    # It comes back under its restart budget and takes requests again.
    wait_for(client, "replica 1 of stage 1 not back", lambda s: all(x.ready for x in s.stages), timeout_s=600)
    back = next(s for s in client.status().stages if (s.stage_id, s.replica) == (1, 1))
    assert back.restarts == 1 and back.pid != victim.pid and back.failed is None
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        again = list(pool.map(lambda _: client.generate(TEXT, deadline_s=600), range(2)))
    assert sorted(replicas_of(done, 1) for done in again) == [0, 1]
    check_against_transformers(again[1], TEXT)

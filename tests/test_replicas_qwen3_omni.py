"""Qwen3-Omni with code2wav in two replicas (the shipped tiny pipeline, `replicas: 2` on stage
2): every request equals transformers on the same checkpoint (the oracle and checks of
test_qwen3_omni_pipeline: thinker tokens, every frame's 16 codes, the waveform), and
concurrent requests spread over both code2wav replicas."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from omni_mp.client.omni_client import OmniClient
from omni_mp.stage_configs import CONFIG_DIR
from tests.launcher import ServedPipeline, serve, settled_client, with_replicas
from tests.test_qwen3_omni_pipeline import _stream, check

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedPipeline]:
    with serve(with_replicas(CONFIG_DIR / "tiny_qwen3_omni.yaml", tmp_path_factory.mktemp("replicas"), {2: 2})) as s:
        yield s


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


def test_code2wav_x2_gives_every_request_the_one_replica_output(client: OmniClient) -> None:
    assert [(s.stage_id, s.replica) for s in client.status().stages] == [(0, 0), (1, 0), (2, 0), (2, 1)]
    jobs = [("text", "ethan"), ("text", "chelsie"), ("text", "ethan"), ("text", "chelsie")]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        runs = list(pool.map(lambda job: _stream(client, *job), jobs))
    for (name, speaker), run in zip(jobs, runs, strict=True):
        check(run, name, speaker)
    bound = sorted(next(d.replica for d in run.finished.stage_timings if d.stage_id == 2) for run in runs)
    assert bound == [0, 0, 1, 1], f"code2wav replicas {bound}"

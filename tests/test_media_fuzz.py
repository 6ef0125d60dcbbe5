"""Media fuzz: malformed and extreme WAV, FLAC, PNG and JPEG files and arrays (tests/fuzz_media.py)
through the real path: the client's media helpers -> the coordinator -> stage 0 of the tiny
Qwen2.5-Omni pipeline (its thinker, alone: a served launcher process, started once).

Each input gets a clear error (its message names what is wrong) or a reply; where a
well-formed equivalent exists (a stereo file and the mean of its channels, an RGBA PNG and
its RGB pixels) the reply is that input's. Meanwhile:
- the stage's memory stays bounded: its peak resident set during the fuzz (VmHWM, reset just
  before) exceeds its resident set before by at most PEAK_RSS_BOUND;
- a bystander text request, run back to back throughout, keeps its median latency within 2x
  its idle median;
- the stage process never dies (same pid, no restart).
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from omni_mp.client import OmniClient, RequestError
from omni_mp.models.registry import prompt_format, resolve_model
from tests.fuzz_media import Case, array_cases, audio_file_cases, image_file_cases
from tests.launcher import REPO, ServedPipeline, serve, settled_client

pytestmark = pytest.mark.engine

CONFIG = REPO / "stage_configs" / "tiny_qwen2_5_omni.yaml"
# The stage's peak resident set may grow this much while it takes the fuzz: the largest media
# it accepts (30 s at 384 kHz: 46 MB of samples; a 16 Mpixel image: 50 MB) each held a few
# times over (message, copy, processor features), plus vLLM's per-request buffers.
PEAK_RSS_BOUND = 1 << 30
DEADLINE_S = 120.0
BYSTANDER = "Tell me about the sea."


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedPipeline]:
    cfg = yaml.safe_load(CONFIG.read_text())
    thinker = cfg["stages"][0]
    thinker.pop("hidden_states", None)  # no talker to stream them to
    thinker["sampling"]["max_tokens"] = 4
    path = tmp_path_factory.mktemp("cfg") / "thinker.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny_qwen2_5_omni_thinker", "stages": [thinker]}))
    with serve(path) as served:
        yield served


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


def _reply(client: OmniClient, case_name: str, audios: list[Any], images: list[Any]) -> list[int] | str:
    """The thinker's tokens, or the error's message."""
    try:
        done = client.generate("What is this?", audios=audios, images=images, deadline_s=DEADLINE_S)
    except (RequestError, ValueError) as err:
        return str(err)
    return list(done.outputs[0].token_ids)


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


class Bystander(threading.Thread):
    """Text requests back to back until stopped; their latencies."""

    def __init__(self, client: OmniClient) -> None:
        super().__init__(daemon=True)
        self.client, self.stop, self.latencies = client, threading.Event(), []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.latencies.append(_timed(self.client))
            except BaseException as err:  # noqa: BLE001 - reported by the test
                self.errors.append(err)
                return


def _timed(client: OmniClient) -> float:
    t0 = time.monotonic()
    client.generate(BYSTANDER, deadline_s=DEADLINE_S)
    return time.monotonic() - t0


def _cases(tmp_path: Path) -> list[Case]:
    window_s = prompt_format("qwen2_5_omni").max_audio_s(resolve_model("tiny-qwen2_5-omni"))
    assert window_s is not None
    return [*audio_file_cases(tmp_path, window_s), *image_file_cases(tmp_path), *array_cases(window_s)]


def test_hostile_media_get_a_clear_error_or_a_correct_reply(client: OmniClient, tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    stage = client.status().stages[0]
    idle = statistics.median(_timed(client) for _ in range(7))
    proc = psutil.Process(stage.pid)
    Path(f"/proc/{stage.pid}/clear_refs").write_text("5")  # VmHWM := the resident set now
    rss_before = proc.memory_info().rss
    bystander = Bystander(client)
    bystander.start()
    failures = []
    try:
        for case in cases:
            got = _reply(client, case.name, case.audios, case.images)
            if case.error is not None:
                if not isinstance(got, str) or not re.search(case.error, got):
                    failures.append(f"{case.name}: expected an error matching {case.error!r}, got {got!r}")
            elif isinstance(got, str):
                failures.append(f"{case.name}: expected a reply, got the error {got!r}")
            elif case.same_as is not None and got != (want := _reply(client, case.name, *case.same_as)):
                failures.append(f"{case.name}: replied {got}, its well-formed equivalent {want}")
    finally:
        bystander.stop.set()
        bystander.join(timeout=DEADLINE_S)
    peak = _peak_rss(stage.pid)
    assert not failures, "\n".join(failures)
    assert not bystander.errors, bystander.errors
    assert peak - rss_before <= PEAK_RSS_BOUND, f"stage 0's peak RSS rose {(peak - rss_before) / 2**20:.0f} MiB"
    busy = statistics.median(bystander.latencies)
    assert busy <= 2 * idle, f"bystander median latency {busy:.3f}s during the fuzz vs {idle:.3f}s idle"
    after = client.status().stages[0]
    assert after.pid == stage.pid and after.restarts == 0 and after.alive

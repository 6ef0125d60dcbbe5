"""Media fuzz: malformed and extreme WAV, FLAC, PNG and JPEG files and arrays (tests/fuzz_media.py)
through the real path: the client's media helpers -> the coordinator -> stage 0 of the tiny
Qwen2.5-Omni pipeline (its thinker, alone: a served launcher process, started once).

Each input gets a clear error (its message names what is wrong) or a reply; where a
well-formed equivalent exists (a stereo file and the mean of its channels, an RGBA PNG and
its RGB pixels) the reply is that input's. Meanwhile:
- the stage's memory stays bounded: its peak resident set during the fuzz (VmHWM, reset just
  before) exceeds its resident set before by at most PEAK_RSS_BOUND;
- a bystander text request (32 tokens), run back to back throughout on a client of its own,
  keeps its median latency within 2x its idle median (each input is sent once the bystander
  request it overlapped has ended, so each bystander request meets about one input);
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

from omni_mp.client.media import multi_modal_input
from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.models.registry import prompt_format, resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import SamplingParamsMsg
from tests.fuzz_media import Case, array_cases, audio_file_cases, image_file_cases
from tests.launcher import ServedPipeline, serve, settled_client
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen2_5_omni.yaml"
# The stage's peak resident set may grow this much while it takes the fuzz: the largest media
# it accepts (30 s at 384 kHz: 46 MB of samples; a 4096x4096 image: 50 MB) each held a few
# times over (message, copy, the processor's float copies), plus vLLM's per-request buffers.
PEAK_RSS_BOUND = 512 << 20
DEADLINE_S = 120.0
BYSTANDER = "Tell me about the sea."
# A reply of some length: what is measured is its decoding among the fuzz's requests, not the
# fixed cost of one message round trip.
BYSTANDER_SAMPLING = SamplingParamsMsg(max_tokens=32, temperature=0.0, ignore_eos=True)


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


def _reply(client: OmniClient, audios: list[Any], images: list[Any]) -> list[int] | str:
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

    def wait_past(self, n: int) -> None:
        """Until more than `n` requests have ended (or the bystander failed)."""
        deadline = time.monotonic() + DEADLINE_S
        while len(self.latencies) <= n and not self.errors and time.monotonic() < deadline:
            time.sleep(0.002)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.latencies.append(_timed(self.client))
            except BaseException as err:  # noqa: BLE001 - reported by the test
                self.errors.append(err)
                return


def _timed(client: OmniClient) -> float:
    t0 = time.monotonic()
    client.generate(BYSTANDER, sampling={0: BYSTANDER_SAMPLING}, deadline_s=DEADLINE_S)
    return time.monotonic() - t0


def _cases(tmp_path: Path) -> list[Case]:
    window_s = prompt_format("qwen2_5_omni").max_audio_s(resolve_model("tiny-qwen2_5-omni"))
    assert window_s is not None
    return [*audio_file_cases(tmp_path, window_s), *image_file_cases(tmp_path), *array_cases(window_s)]


def _read(case: Case) -> tuple[list[Any], list[Any]] | str:
    """The client's media helpers: the case's media as the arrays a Submit carries, or their error."""
    try:
        media = multi_modal_input(case.audios, case.images)
    except ValueError as err:
        return str(err)
    if media is None:
        return [], []
    return [(a.samples, a.sample_rate) for a in media.audios], [im.pixels for im in media.images]


def _check(case: Case, got: list[int] | str, client: OmniClient) -> str | None:
    """What is wrong with the outcome of `case`, if anything."""
    if case.error is not None:
        if not isinstance(got, str) or not re.search(case.error, got):
            return f"{case.name}: expected an error matching {case.error!r}, got {got!r}"
    elif isinstance(got, str):
        return f"{case.name}: expected a reply, got the error {got!r}"
    elif case.same_as is not None and got != (want := _reply(client, *case.same_as)):
        return f"{case.name}: replied {got}, its well-formed equivalent {want}"
    return None


def test_hostile_media_get_a_clear_error_or_a_correct_reply(
    pipeline: ServedPipeline, client: OmniClient, tmp_path: Path
) -> None:
    cases = _cases(tmp_path)
    # Files are read first (the client's work, in this process), so that the bystander's latency
    # measures the pipeline: the coordinator and the stage taking the fuzz.
    read = [_read(case) for case in cases]
    # One request of each kind first: a stage's first audio, first image and first large image
    # pay one-time costs (seconds) that are no stall.
    for warm in ([(tone(1.0), 16_000)], [pattern()]), ([], [pattern(1024)]):
        assert not isinstance(_reply(client, *warm), str)
    stage = client.status().stages[0]
    idle = [_timed(client) for _ in range(7)]
    proc = psutil.Process(stage.pid)
    Path(f"/proc/{stage.pid}/clear_refs").write_text("5")  # VmHWM := the resident set now
    rss_before = proc.memory_info().rss
    bystander = Bystander(OmniClient(pipeline.endpoint))  # another user: a client of its own
    bystander.start()
    outcomes: list[list[int] | str] = []
    try:
        for media in read:
            if isinstance(media, str):  # refused by the client's helpers: nothing to send
                outcomes.append(media)
                continue
            n = len(bystander.latencies)
            outcomes.append(_reply(client, *media))
            bystander.wait_past(n)  # inputs and bystander requests overlap about one to one
    finally:
        bystander.stop.set()
        bystander.join(timeout=DEADLINE_S)
        bystander.client.close()
    peak = _peak_rss(stage.pid)
    # Idle before and after, pooled: the machine's own load drifts over the minute this takes.
    idle_s = statistics.median(idle + [_timed(client) for _ in range(7)])
    busy_s = statistics.median(bystander.latencies) if bystander.latencies else float("inf")
    print(
        f"\n[media fuzz] {len(cases)} inputs; stage 0 peak RSS +{(peak - rss_before) / 2**20:.0f} MiB "
        f"(bound {PEAK_RSS_BOUND / 2**20:.0f}); bystander median {1000 * busy_s:.0f} ms over "
        f"{len(bystander.latencies)} requests (idle {1000 * idle_s:.0f} ms)"
    )
    failures = [f for case, got in zip(cases, outcomes, strict=True) if (f := _check(case, got, client))]
    assert not failures, "\n".join(failures)
    assert not bystander.errors, bystander.errors
    assert peak - rss_before <= PEAK_RSS_BOUND, f"stage 0's peak RSS rose {(peak - rss_before) / 2**20:.0f} MiB"
    assert busy_s <= 2 * idle_s, f"bystander median latency {busy_s:.3f}s during the fuzz vs {idle_s:.3f}s idle"
    after = client.status().stages[0]
    assert after.pid == stage.pid and after.restarts == 0 and after.alive

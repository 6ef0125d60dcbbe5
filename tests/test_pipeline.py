"""The tiny_chain pipeline end to end: a real launcher process, two real vLLM stage processes,
real ZMQ sockets; results checked against transformers running the same two-stage chain."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from omni_mp.client.omni_client import AsyncOmniClient, OmniClient, RequestError
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk, StageStats
from tests.hf_oracle import assert_same_tokens, greedy, tokenize
from tests.launcher import ServedPipeline, serve, settled_client

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_chain.yaml"
N0 = N1 = 16  # max_tokens of stage 0 and stage 1 in tiny_chain.yaml


# Long enough (~2000 engine steps, seconds on CPU) that an abort or deadline lands mid-way.
LONG = 2000


def long_stage(stage_id: int, n: int = LONG) -> dict[int, SamplingParamsMsg]:
    return {stage_id: SamplingParamsMsg(max_tokens=n, temperature=0.0, ignore_eos=True)}


def chain_oracle(prompt: str, n0: int = N0, n1: int = N1) -> tuple[list[int], list[float]]:
    """transformers: stage 0 greedy on tiny-qwen2, then stage 1 greedy on tiny-qwen2-b from prompt+output."""
    m0, m1 = resolve_model("tiny-qwen2"), resolve_model("tiny-qwen2-b")
    ids = tokenize(m0, prompt)
    out0, _ = greedy(m0, ids, n0)
    return greedy(m1, ids + out0, n1)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[ServedPipeline]:
    with serve(CONFIG) as served:
        yield served


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:  # nothing may stay in flight after a test
        yield c  # type: ignore[misc]


def test_generate_matches_transformers(client: OmniClient) -> None:
    for prompt in ["Hello world, how are you?", "The quick brown fox"]:
        done = client.generate(prompt, timeout_s=120)
        assert [o.stage_id for o in done.outputs] == [1]
        want, margins = chain_oracle(prompt)
        assert_same_tokens(done.outputs[0].token_ids, want, margins, f"chain({prompt!r})")
        assert done.outputs[0].finish_reason == "length"
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(resolve_model("tiny-qwen2-b"))
        assert done.outputs[0].text == tok.decode(want)
        timings = {d.stage_id: d for d in done.stage_timings}
        assert timings[0].num_output_tokens == N0 and timings[1].num_output_tokens == N1
        assert timings[1].num_prompt_tokens == len(tokenize(resolve_model("tiny-qwen2"), prompt)) + N0
        # Stage 1 starts only after stage 0 has finished (it continues stage 0's whole output).
        assert timings[1].t_started >= timings[0].t_finished


def test_concurrent_requests_each_get_their_own_result(pipeline: ServedPipeline) -> None:
    prompts = [f"user: tell me story number {i} about a robot" + " please" * (i % 4) for i in range(8)]
    lengths = [4 + 3 * i for i in range(8)]

    async def run() -> list[Finished]:
        async with AsyncOmniClient(pipeline.endpoint) as ac:
            return await asyncio.gather(
                *(
                    ac.generate(p, sampling={1: SamplingParamsMsg(max_tokens=n, ignore_eos=True)}, timeout_s=180)
                    for p, n in zip(prompts, lengths, strict=True)
                )
            )

    results = asyncio.run(run())
    for prompt, n, done in zip(prompts, lengths, results, strict=True):
        want, margins = chain_oracle(prompt, N0, n)
        assert_same_tokens(done.outputs[0].token_ids, want, margins, f"chain({prompt!r}, {n})")
    # The requests really overlapped inside stage 1 (it batches across requests every step):
    # some request started there before an earlier-started one had finished. (Not "the first to
    # finish outlived the second start": on a loaded machine the 4-token request may finish
    # before stage 0 hands over the second.)
    spans = sorted((d.t_started, d.t_finished) for r in results for d in r.stage_timings if d.stage_id == 1)
    assert len(spans) == 8
    overlaps = sum(1 for i in range(1, 8) if spans[i][0] < max(end for _, end in spans[:i]))
    assert overlaps >= 2, f"stage 1 ran the requests (nearly) one after another: {spans}"


def test_stream_yields_each_step_as_it_is_produced(client: OmniClient) -> None:
    events = list(client.stream("Hello world, how are you?", timeout_s=120))
    chunks = [e for e in events if isinstance(e, StageOutputChunk)]
    assert isinstance(events[-1], Finished) and all(isinstance(e, StageOutputChunk) for e in events[:-1])
    # One chunk per engine step of the final stage, each with the step's new token.
    assert len(chunks) == N1 and all(len(c.token_ids) == 1 for c in chunks)
    assert [t for c in chunks for t in c.token_ids] == events[-1].outputs[0].token_ids
    assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])


def test_stream_arrival_is_incremental(client: OmniClient) -> None:
    """Chunks arrive over time, not in one burst at the end."""
    arrivals = []
    for ev in client.stream(
        "The quick brown fox", sampling={1: SamplingParamsMsg(max_tokens=64, ignore_eos=True)}, timeout_s=120
    ):
        arrivals.append(time.monotonic())
        if isinstance(ev, Finished):
            break
    assert len(arrivals) == 65
    assert arrivals[-1] - arrivals[0] > 0.01  # 64 engine steps cannot all land at once


def _long_stream_started(client: OmniClient, prompt: str, rid: str) -> tuple[threading.Thread, list[BaseException]]:
    """A long request streamed on a thread, once its first chunk arrived; the thread collects
    the error that ends it (the caller aborts it)."""
    started = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in client.stream(prompt, request_id=rid, sampling=long_stage(1), timeout_s=120):
                started.set()
        except BaseException as err:  # noqa: BLE001 - collected for the caller's assertions
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60), "the request never started streaming"
    return t, errors


def _stats_when(client: OmniClient, ok: Callable[[dict[int, StageStats]], bool]) -> dict[int, StageStats]:
    """Every stage's stats from status(), once `ok` holds for them (a few heartbeats at most)."""
    deadline = time.monotonic() + 10
    while True:
        got = {s.stage_id: s.stats for s in client.status().stages}
        stats = {sid: st for sid, st in got.items() if st is not None}
        if len(stats) == len(got) and ok(stats):
            return stats
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def _sent(stats: StageStats, downstream: int) -> int:
    return sum(link.nbytes for link in stats.sent if link.stage_id == downstream)


def test_status_reports_each_stage_load_and_counters(client: OmniClient) -> None:
    """The stages' heartbeats carry their stats into status(): stage 1's engine holds the long
    request while it streams; afterwards no stage holds one, and every stage's steps and step
    time, and stage 0's bytes to stage 1, have grown."""
    before = _stats_when(client, lambda st: True)
    t, errors = _long_stream_started(client, "Hello", "stats-id")
    _stats_when(client, lambda st: st[1].running == 1 and st[1].waiting == 0)
    client.abort("stats-id")
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], RequestError) and errors[0].code == "aborted", errors
    # A stage's heartbeat may not have ticked since it last stepped (stage 0 finishes its part
    # long before the abort), so wait for the beats that carry this request's steps.
    after = _stats_when(
        client,
        lambda st: all(s.running == 0 and s.waiting == 0 and s.steps > before[sid].steps for sid, s in st.items()),
    )
    for sid, s in after.items():
        assert s.step_seconds > before[sid].step_seconds, (sid, before, after)
    assert _sent(after[0], 1) > _sent(before[0], 1)
    assert not after[1].sent  # the final stage sends to no other stage


def test_abort_mid_request_does_not_poison_later_requests(client: OmniClient) -> None:
    t, errors = _long_stream_started(client, "The quick brown fox", "same-id")
    client.abort("same-id")
    t.join(10)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RequestError) and errors[0].code == "aborted", errors
    # The same id again, now a normal request: fresh state everywhere, exact result.
    done = client.generate("The quick brown fox", request_id="same-id", timeout_s=120)
    want, margins = chain_oracle("The quick brown fox")
    assert_same_tokens(done.outputs[0].token_ids, want, margins, "after abort")


def test_closing_a_stream_early_aborts_the_request(client: OmniClient) -> None:
    stream = client.stream("Hello", sampling=long_stage(1), timeout_s=120)
    first = next(stream)
    assert isinstance(first, StageOutputChunk)
    stream.close()  # the client sends the abort; the fixture checks nothing stays in flight


def test_deadline_ends_the_request_everywhere(client: OmniClient) -> None:
    t0 = time.monotonic()
    with pytest.raises(RequestError) as err:
        client.generate("Hello", sampling=long_stage(0), deadline_s=0.3, timeout_s=60)
    assert err.value.code == "deadline_exceeded"
    assert time.monotonic() - t0 < 2.0
    done = client.generate("Hello", timeout_s=120)
    assert len(done.outputs[0].token_ids) == N1


def test_bad_input_fails_that_request_only(client: OmniClient) -> None:
    good: list[Finished] = []
    t = threading.Thread(target=lambda: good.append(client.generate("The quick brown fox", timeout_s=120)))
    t.start()
    with pytest.raises(RequestError) as err:
        client.generate(prompt_token_ids=[5, 99999], timeout_s=60)
    assert err.value.code == "invalid_input" and err.value.stage_id == 0
    assert "99999" in str(err.value)
    # Sampling params that only vLLM rejects, for stage 1: found there, after stage 0 ran.
    with pytest.raises(RequestError) as err:
        client.generate("Hello", sampling={1: SamplingParamsMsg(max_tokens=4, min_tokens=8)}, timeout_s=120)
    assert err.value.code == "invalid_input" and err.value.stage_id == 1
    assert "min_tokens" in str(err.value)
    with pytest.raises(RequestError) as err:
        client.generate("Hello", prompt_token_ids=[1, 2], timeout_s=60)
    assert err.value.code == "invalid_input"
    with pytest.raises(RequestError) as err:
        client.generate("Hello", sampling={9: SamplingParamsMsg()}, timeout_s=60)
    assert "unknown stage id 9" in str(err.value)
    t.join(120)
    want, margins = chain_oracle("The quick brown fox")
    assert_same_tokens(good[0].outputs[0].token_ids, want, margins, "concurrent good request")


def test_garbage_frames_get_an_error_and_the_pipeline_keeps_serving(
    pipeline: ServedPipeline, client: OmniClient
) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(pipeline.endpoint)
    try:
        for frames in ([b"\xff\x00garbage"], [b"\x81\xa1t\xa6Submit", b"extra"], [b""]):
            sock.send_multipart(frames)
            assert sock.poll(10_000), "no answer to an invalid message"
            reply = sock.recv_multipart()
            assert b"invalid_message" in reply[0]
    finally:
        sock.close(linger=0)
        ctx.term()
    assert len(client.generate("Hello", timeout_s=120).outputs[0].token_ids) == N1


def test_stage_killed_mid_request_fails_fast_and_is_restarted(client: OmniClient) -> None:
    status = client.status()
    stage1 = next(s for s in status.stages if s.stage_id == 1)
    errors: list[BaseException] = []
    started = threading.Event()

    def run() -> None:
        try:
            for _ in client.stream("Hello", sampling=long_stage(1), timeout_s=120):
                started.set()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60), "stage 1 never produced a chunk"
    t_kill = time.monotonic()
    os.kill(stage1.pid, signal.SIGKILL)
    t.join(10)
    elapsed = time.monotonic() - t_kill
    assert len(errors) == 1 and isinstance(errors[0], RequestError), errors
    assert errors[0].code == "stage_died" and errors[0].stage_id == 1
    assert elapsed < 2.0, f"the in-flight request failed {elapsed:.2f}s after the kill"
    # Restart policy (max_restarts 3): stage 1 comes back and serves exact results again.
    deadline = time.monotonic() + 300
    while True:
        stages = client.status().stages
        s1 = next(s for s in stages if s.stage_id == 1)
        if all(s.ready and s.alive for s in stages):  # stage 0 re-linked to the new stage 1 too
            break
        assert time.monotonic() < deadline, "stage 1 was not restarted"
        time.sleep(0.5)
    assert s1.restarts == 1 and s1.pid != stage1.pid
    done = client.generate("Hello world, how are you?", timeout_s=120)
    want, margins = chain_oracle("Hello world, how are you?")
    assert_same_tokens(done.outputs[0].token_ids, want, margins, "after restart")

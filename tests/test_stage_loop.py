"""The stage loop on a real in-process vLLM engine and real ZMQ sockets, with the test in the
roles around it: the coordinator (it binds the events link and registers requests), the
upstream stage (it sends StageOutputBatch chunks) and, where a test needs one, a downstream
stage that stops reading. Covers the defects review found in the stage's data path:
heartbeats starved by a blocked send, late chunks of ended requests held as orphans, a
full orphan buffer losing a live request, and a hidden-row gap killing the whole stage."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from omni_mp.config.schema import PipelineConfig
from omni_mp.config.validate import parse_config
from omni_mp.control.endpoints import new_run_id
from omni_mp.models.registry import resolve_model
from omni_mp.stage.loop import StageLoop
from omni_mp.stage.timeline import PROFILE_DIR_ENV
from omni_mp.wire.messages import (
    Abort,
    Connect,
    ErrorEvent,
    Heartbeat,
    Message,
    SamplingParamsMsg,
    Shutdown,
    StageDone,
    StageEndpoint,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
)
from omni_mp.wire.transport import MessageReceiver, MessageSender
from tests.hf_oracle import greedy, tokenize
from tests.launcher import engine_is_empty, in_process_engine

pytestmark = pytest.mark.engine

ENGINE_ARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 8}


def config(downstream: bool = False, **top: Any) -> PipelineConfig:
    """Stage 1 continues stage 0's tokens and streams its hidden states; the test plays stage 0
    (and, with `downstream`, a stage 2 after stage 1: its links get stage 2's pool)."""
    stage = {"model": "tiny-qwen2", "engine_args": ENGINE_ARGS, "sampling": {"max_tokens": 8, "ignore_eos": True}}
    after = [{"id": 2, **stage, "inputs": [1], "processor": "continue_tokens", "final_output": True}]
    return parse_config(
        {
            "name": "loop_harness",
            "stages": [
                {"id": 0, **stage},
                {
                    "id": 1,
                    **stage,
                    "inputs": [0],
                    "processor": "continue_tokens",
                    "hidden_states": {},
                    "final_output": True,
                },
                *(after if downstream else []),
            ],
            **top,
        }
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from omni_mp.engines.ar import EngineFeatures

    with in_process_engine("tiny-qwen2", ENGINE_ARGS, EngineFeatures(hidden_states=True)) as eng:
        yield eng


class Harness:
    def __init__(
        self, engine: Any, cfg: PipelineConfig, tweak: Callable[[StageLoop], None] | None = None, stage_id: int = 1
    ) -> None:
        run = new_run_id()
        self.ctx = zmq.Context()
        self.limits = cfg.limits
        self.events = MessageReceiver(self.ctx, f"ipc://@{run}-events", cfg.limits)
        self.stage_id = stage_id
        self.input_endpoint = f"ipc://@{run}-stage{stage_id}"
        self._links = [
            MessageReceiver(self.ctx, self.input_endpoint, cfg.limits),
            MessageSender(self.ctx, f"ipc://@{run}-events", cfg.limits),
            MessageSender(self.ctx, f"ipc://@{run}-events", cfg.limits),
        ]
        self.loop = StageLoop(cfg, cfg.stage(stage_id), engine, self.ctx, *self._links)
        if tweak is not None:
            tweak(self.loop)
        self.upstream = MessageSender(self.ctx, self.input_endpoint, cfg.limits)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.seen: list[Message] = []
        self.closed = False

    def _run(self) -> None:
        try:
            self.loop.run()
        except BaseException as err:  # noqa: BLE001 - the test asserts on it
            self.error = err

    def send(self, msg: Message) -> None:
        self.upstream.send(msg, timeout=5)

    def register(self, rid: str, max_tokens: int = 8, prompt_token_ids: list[int] | None = None) -> None:
        """Register a request (for an entry stage, with its prompt)."""
        sampling = SamplingParamsMsg(max_tokens=max_tokens, ignore_eos=True)
        self.send(
            StageRequest(
                request_id=rid, stage_id=self.stage_id, prompt_token_ids=prompt_token_ids, sampling_params=sampling
            )
        )

    def feed(self, rid: str, prompt_ids: list[int]) -> None:
        """Stage 0's only chunk for `rid`: continue_tokens starts stage 1 on it."""
        chunk = StageOutputChunk(request_id=rid, stage_id=0, token_ids=[], prompt_token_ids=prompt_ids, finished=True)
        self.send(StageOutputBatch([chunk]))

    def wait_for(self, pred: Callable[[Message], bool], timeout_s: float = 60) -> Message:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in self.seen:
                if pred(msg):
                    return msg
            try:
                self.seen.append(self.events.recv(timeout=0.1))
            except TimeoutError:
                assert self.thread.is_alive(), f"the stage loop died: {self.error!r}"
        raise AssertionError(f"no such event within {timeout_s}s; seen: {[type(m).__name__ for m in self.seen]}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.thread.is_alive():
            self.send(Shutdown(reason="test done"))
            self.thread.join(30)
        assert not self.thread.is_alive()
        engine = self.loop.engine
        vars(engine).pop("prepare", None)  # a tweak's wrapper: the next test gets the engine's own
        engine.abort(list(self.loop.requests))
        while not engine_is_empty(engine):  # leave the shared engine empty for the next test
            engine.step()
        for link in [self.upstream, self.events, *self._links]:
            link.close()
        self.ctx.term()


def done_of(rid: str) -> Callable[[Message], bool]:
    return lambda m: isinstance(m, StageDone) and m.request_id == rid


def error_of(rid: str) -> Callable[[Message], bool]:
    return lambda m: isinstance(m, ErrorEvent) and m.request_id == rid


@pytest.fixture()
def harness(engine: Any, request: pytest.FixtureRequest) -> Iterator[Harness]:
    marker = request.node.get_closest_marker("harness")
    kw = marker.kwargs if marker else {}
    h = Harness(engine, kw.get("cfg", config()), kw.get("tweak"), kw.get("stage_id", 1))
    try:
        yield h
    finally:
        h.close()


def tokens_of(seen: list[Message], rid: str) -> list[int]:
    """The tokens `rid`'s chunks carried, in order."""
    return [
        t
        for m in seen
        if isinstance(m, StageOutputBatch)
        for c in m.unpacked()
        if c.request_id == rid
        for t in c.token_ids
    ]


def prompt_ids() -> list[int]:
    return tokenize(resolve_model("tiny-qwen2"), "Hello world, how are you?")


def test_the_harness_stage_is_exact(harness: Harness) -> None:
    ids = prompt_ids()
    harness.register("r")
    harness.feed("r", ids)
    harness.wait_for(done_of("r"))
    tokens = tokens_of(harness.seen, "r")
    assert tokens == greedy(resolve_model("tiny-qwen2"), ids, 8)[0]


def test_the_step_timeline_has_wall_and_cpu_time_of_build_and_send(
    engine: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`OMNI_MP_PROFILE_DIR`: every step with output records how long its messages took to
    build (engine thread) and to encode and send (output thread), in wall time and in the
    thread's CPU time (the wall time also holds waits for the GIL): CPU never above wall; and
    the model steps it began and ended (an AR step is one forward pass: one of each)."""
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    h = Harness(engine, config())
    try:
        for rid in ("r", "s"):
            h.register(rid)
            h.feed(rid, prompt_ids())
        for rid in ("r", "s"):
            h.wait_for(done_of(rid))
        steps = [r for r in h.loop.timeline.records if r.reqs > 0]
    finally:
        h.close()
    assert len(steps) >= 8
    for r in steps:
        assert 0 < r.build_cpu_ms <= r.build_ms + 0.05, r
        assert 0 < r.send_cpu_ms <= r.send_ms + 0.05, r
        assert (r.steps_begun, r.steps_ended) == (1, 1), r  # an AR step is one forward pass
    (written,) = tmp_path.glob("stage1-*.json")
    doc = json.loads(written.read_text())
    fields = {"build_cpu_ms", "send_cpu_ms", "steps_begun", "steps_ended"}
    assert fields <= set(doc["fields"]) and len(doc["steps"]) >= len(steps)


def test_late_chunks_of_an_ended_request_are_dropped_at_once(harness: Harness) -> None:
    harness.register("ended", max_tokens=200)
    harness.feed("ended", prompt_ids())
    harness.send(Abort(request_id="ended", reason="test"))
    harness.feed("ended", prompt_ids())  # a chunk still in flight from upstream
    harness.register("after")  # processed after both (one input pipe, control first)
    harness.feed("after", prompt_ids())
    harness.wait_for(done_of("after"))
    # Before: the late chunk waited 10 s as an orphan, holding its buffers.
    assert harness.loop.orphans.count == 0
    # A chunk that overtakes its registration still waits for it, and then runs.
    harness.feed("early", prompt_ids())
    deadline = time.monotonic() + 10
    while harness.loop.orphans.count == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert harness.loop.orphans.count == 1
    harness.register("early")
    harness.wait_for(done_of("early"))
    assert harness.loop.orphans.count == 0


def _two_orphans(loop: StageLoop) -> None:
    loop.orphans.max_chunks = 2


@pytest.mark.harness(tweak=_two_orphans)
def test_a_full_orphan_buffer_fails_the_request_it_cannot_keep(harness: Harness) -> None:
    for rid in ("a", "b", "c"):
        harness.feed(rid, prompt_ids())
    err = harness.wait_for(error_of("c"))
    assert isinstance(err, ErrorEvent) and err.code == "overloaded" and "wait for their registration" in err.message
    harness.register("a")  # the kept ones still run
    harness.wait_for(done_of("a"))


def _drop_rows_of(loop: StageLoop, rid: str, at_call: int) -> None:
    """Fault injection: lose one step's captured rows of `rid` (a gap in its hidden states)."""
    collect, calls = loop.engine.io.collect, {"n": 0}

    def lossy(finishing: set[str]) -> dict[str, Any]:
        out = collect(finishing)
        if rid in out:
            calls["n"] += 1
            if calls["n"] == at_call:
                del out[rid]
        return out

    loop.engine.io.collect = lossy


@pytest.mark.harness(tweak=lambda loop: _drop_rows_of(loop, "gap", 3))
def test_a_hidden_row_gap_fails_that_request_only(harness: Harness) -> None:
    harness.register("gap", max_tokens=12)
    harness.register("ok", max_tokens=12)
    harness.feed("gap", prompt_ids())
    harness.feed("ok", prompt_ids())
    err = harness.wait_for(error_of("gap"))
    assert isinstance(err, ErrorEvent) and "gap" in err.message
    harness.wait_for(done_of("ok"))  # before: a RuntimeError ended the whole stage here
    harness.register("next")
    harness.feed("next", prompt_ids())
    harness.wait_for(done_of("next"))
    try:
        del harness.loop.engine.io.collect  # back to the engine's own method
    except AttributeError:
        pass


STALL = config(
    downstream=True,
    timeouts={"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 1.0},
    endpoints={"shm": {"num_slots": 2, "threshold_bytes": 1, "capacity_bytes": 1 << 20, "prefault": False}},
)


@pytest.mark.harness(cfg=STALL)
def test_heartbeats_go_on_while_a_send_waits_on_a_stalled_consumer(harness: Harness) -> None:
    stalled = MessageReceiver(harness.ctx, f"ipc://@{new_run_id()}-stalled", harness.limits)  # never reads
    try:
        endpoint = stalled.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        harness.send(Connect(downstream=[StageEndpoint(stage_id=2, endpoint=endpoint)]))
        harness.register("r", max_tokens=40)
        harness.feed("r", prompt_ids())
        time.sleep(0.2)  # by now two batches fill the pool and the third send waits for credits
        assert harness.loop.output.downstream, "the stage did not connect to the stalled consumer"
        harness.seen.clear()
        t0 = time.monotonic()
        beats: list[float] = []
        while time.monotonic() - t0 < 3.0:  # three heartbeat timeouts
            try:
                msg = harness.events.recv(timeout=0.1)
            except TimeoutError:
                continue
            if isinstance(msg, Heartbeat):
                beats.append(time.monotonic() - t0)
        gaps = [b - a for a, b in zip([0.0, *beats], [*beats, 3.0], strict=True)]
        assert max(gaps) < 0.5, f"heartbeat gaps while a send was blocked: max {max(gaps):.2f}s"
        assert harness.loop.output.is_alive() and harness.loop.output._queue, "the send was not blocked"
    finally:
        # Release the stalled consumer so the stage can flush and stop.
        drain_until = time.monotonic() + 5
        while time.monotonic() < drain_until:
            try:
                stalled.recv(timeout=0.1)
            except TimeoutError:
                if not harness.loop.output._queue:
                    break
        stalled.close()


def _failing_preparation(loop: StageLoop) -> None:
    """Fault injection around the real `prepare`: requests named `fail-<kind>` spend 0.2 s in
    preparation and then raise that kind of exception; the others are prepared as usual."""
    prepare = loop.engine.prepare
    kinds = {"memory": MemoryError, "runtime": RuntimeError, "value": ValueError, "key": KeyError}
    loop.steps_while_preparing = []  # type: ignore[attr-defined]

    def injected(request_id: str, *args: Any) -> Any:
        kind = request_id.removeprefix("fail-")
        if kind not in kinds:
            return prepare(request_id, *args)
        before = loop.timeline.steps
        time.sleep(0.2)
        loop.steps_while_preparing.append(loop.timeline.steps - before)  # type: ignore[attr-defined]
        raise kinds[kind](f"injected {kind} error")

    loop.engine.prepare = injected


ENTRY = config()  # stage 0 of the same pipeline: an entry stage (the test plays the coordinator)


@pytest.mark.harness(cfg=ENTRY, stage_id=0, tweak=_failing_preparation)
def test_any_exception_while_preparing_fails_that_request_only(harness: Harness) -> None:
    """An entry stage prepares requests beside its engine thread: a preparation that raises
    (MemoryError included) fails its own request with the reason, running requests keep
    stepping meanwhile, and the stage goes on serving."""
    ids = prompt_ids()
    harness.register("bystander", max_tokens=480, prompt_token_ids=ids)
    kinds = ["memory", "runtime", "value", "key"]
    for kind in kinds:
        harness.register(f"fail-{kind}", prompt_token_ids=ids)
    for kind in kinds:
        err = harness.wait_for(error_of(f"fail-{kind}"))
        assert isinstance(err, ErrorEvent) and err.code == "invalid_input"
        assert "could not prepare the request's input" in err.message and f"injected {kind} error" in err.message
    # While each of the four 0.2 s preparations ran, the engine went on stepping the bystander.
    assert min(harness.loop.steps_while_preparing) >= 3, harness.loop.steps_while_preparing  # type: ignore[attr-defined]
    harness.wait_for(done_of("bystander"))
    harness.register("after", prompt_token_ids=ids)
    done = harness.wait_for(done_of("after"))
    assert isinstance(done, StageDone) and done.num_output_tokens == 8


def _held_steps(loop: StageLoop) -> None:
    """The test can hold the engine thread at its next step (`loop.hold`: clear the gate, then
    wait for `held`), as a long step would; the preparer's results are stamped as it delivers them."""
    gate, held, delivered = threading.Event(), threading.Event(), {}
    gate.set()
    step = loop._step

    def gated(wait_s: float) -> bool:
        if not gate.is_set():
            held.set()
            gate.wait(120)
        return step(wait_s)

    assert loop.preparer is not None
    deliver = loop.preparer.deliver

    def stamped(result: Any) -> None:
        delivered[result.request_id] = (time.time(), loop.timeline.steps)
        deliver(result)

    loop._step = gated  # type: ignore[method-assign]
    loop.preparer.deliver = stamped
    loop.hold = (gate, held, delivered)  # type: ignore[attr-defined]


SOLO = parse_config(  # one entry stage whose outputs come to the test (the events link)
    {
        "name": "solo",
        "stages": [{"id": 0, "model": "tiny-qwen2", "engine_args": ENGINE_ARGS, "final_output": True}],
    }
)


@pytest.mark.harness(cfg=SOLO, stage_id=0, tweak=_held_steps)
def test_a_request_arriving_during_a_step_is_prepared_before_the_step_ends(harness: Harness) -> None:
    """An entry stage starts a request's preparation as the request arrives, beside the engine's
    step in flight: with the engine thread held in a step, a request sent meanwhile is received,
    prepared and waiting before the step ends (it used to wait for the step to end to be
    registered, and only then be prepared, while the next step ran). It then runs exactly."""
    ids = prompt_ids()
    gate, held, delivered = harness.loop.hold  # type: ignore[attr-defined]
    gate.clear()
    try:
        harness.register("bystander", max_tokens=64, prompt_token_ids=ids)
        assert held.wait(60), "the engine thread never stepped the bystander"
        steps = harness.loop.timeline.steps
        harness.register("r", prompt_token_ids=ids)
        deadline = time.monotonic() + 30
        while "r" not in delivered and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "r" in delivered, "not prepared while the engine thread was in a step"
        assert delivered["r"][1] == steps == harness.loop.timeline.steps  # no step ended meanwhile
        t_release = time.time()
    finally:
        gate.set()
    done = harness.wait_for(done_of("r"))
    assert isinstance(done, StageDone) and done.num_output_tokens == 8
    assert done.t_prepare_taken is not None and done.t_prepared is not None
    assert done.t_registered <= done.t_prepare_taken <= done.t_prepared < t_release <= done.t_started
    tokens = tokens_of(harness.seen, "r")
    assert tokens == greedy(resolve_model("tiny-qwen2"), ids, 8)[0]
    harness.wait_for(done_of("bystander"))


def _slow_preparation(loop: StageLoop) -> None:
    """Requests named `slow-*` spend 2 s in their (real) preparation; `loop.slow_started` is set
    as the first of them begins."""
    prepare = loop.engine.prepare
    started = threading.Event()

    def slow(request_id: str, *args: Any) -> Any:
        if request_id.startswith("slow-"):
            started.set()
            time.sleep(2.0)  # the margin for the next two registrations to arrive meanwhile
        return prepare(request_id, *args)

    loop.engine.prepare = slow
    loop.slow_started = started  # type: ignore[attr-defined]


@pytest.mark.harness(cfg=SOLO, stage_id=0, tweak=_slow_preparation)
def test_a_request_past_the_preparation_queue_fails_as_overloaded_alone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The input thread queues preparations; past the queue's bound a request fails at once as
    `overloaded`, naming the stage, and the requests already queued run to the end."""
    from omni_mp.stage import prepare

    monkeypatch.setattr(prepare, "MAX_PENDING", 1)
    ids = prompt_ids()
    harness.register("slow-a", prompt_token_ids=ids)
    assert harness.loop.slow_started.wait(30)  # type: ignore[attr-defined]
    harness.register("slow-b", prompt_token_ids=ids)  # waits: the one place in the queue
    harness.register("c", prompt_token_ids=ids)
    err = harness.wait_for(error_of("c"))
    assert isinstance(err, ErrorEvent) and err.code == "overloaded"
    assert "stage 0: too many requests wait for their preparation" in err.message
    for rid in ("slow-a", "slow-b"):
        done = harness.wait_for(done_of(rid))
        assert isinstance(done, StageDone) and done.num_output_tokens == 8
    assert not any(isinstance(m, ErrorEvent) and m.request_id != "c" for m in harness.seen)

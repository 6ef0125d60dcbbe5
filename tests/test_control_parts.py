"""The coordinator's parts on their own: wiring, the request table, admission checks, and the
non-blocking links (real ZMQ sockets, no stage processes: `sleep` stands in for one in wiring)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from omni_mp.config.validate import parse_config
from omni_mp.control.endpoints import RunEndpoints, new_run_id
from omni_mp.control.links import ClientPort, StageLink
from omni_mp.control.requests import Rejected, RequestTable, check_submit
from omni_mp.control.router import ReplicaKey
from omni_mp.control.stage_handle import StageHandle, gpu_stage_threads, stage_env
from omni_mp.control.wiring import Wiring
from omni_mp.wire.codec import Limits, decode, encode
from omni_mp.wire.messages import (
    MAX_PROCESSES,
    Abort,
    Connect,
    ErrorEvent,
    Finished,
    SamplingParamsMsg,
    Shutdown,
    StageEndpoint,
    StageOutputChunk,
    StageRequest,
    StageSampling,
    Submit,
)
from omni_mp.wire.transport import MessageSender

LIMITS = Limits()


def chain_cfg_stages() -> list[dict[str, object]]:
    return [
        {"id": 0, "model": "tiny-qwen2"},
        {"id": 1, "model": "tiny-qwen2", "inputs": [0], "processor": "continue_tokens"},
        {"id": 2, "model": "tiny-qwen2", "inputs": [1], "processor": "continue_tokens", "final_output": True},
    ]


def chain_cfg(**extra: object):
    return parse_config({"name": "t", "stages": chain_cfg_stages(), **extra}, check_engine_args=False)


def test_gpu_stages_share_the_host_cores_and_cpu_stages_get_their_own() -> None:
    """A GPU stage's process gets an equal share of the host's cores for torch's intra-op
    threads (unless the user set OMP_NUM_THREADS); a CPU stage gets as many as its pinned cores."""
    stages = [{**s, "devices": [0]} for s in chain_cfg_stages()]
    gpu = parse_config({"name": "g", "stages": stages}, check_engine_args=False)
    env = stage_env(gpu, gpu.stages[1], base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["OMP_NUM_THREADS"] == str(gpu_stage_threads(3))
    assert [gpu_stage_threads(3, c) for c in (1, 4, 16, 64)] == [1, 1, 4, 16]
    assert stage_env(gpu, gpu.stages[1], base={"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"
    cpu = chain_cfg()
    env = stage_env(cpu, cpu.stages[2], base={"OMP_NUM_THREADS": "7"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "1"


def test_eager_cpu_ar_stages_skip_inductors_isa_probe() -> None:
    """An eager CPU AR stage starts without inductor's SIMD probe (its one compiled kernel, vLLM's
    sampler, is then scalar); a compiled CPU engine and a GPU stage keep it, and a value the
    user set is kept."""
    stages = chain_cfg_stages()
    stages[0] = {**stages[0], "engine_args": {"enforce_eager": True}}
    stages[1] = {**stages[1], "engine_args": {"enforce_eager": False}}
    cpu = parse_config({"name": "c", "stages": stages}, check_engine_args=False)
    envs = [stage_env(cpu, s, base={}) for s in cpu.stages]
    assert [e.get("TORCHINDUCTOR_VEC_ISA_OK") for e in envs] == ["0", None, None]
    assert stage_env(cpu, cpu.stages[0], base={"TORCHINDUCTOR_VEC_ISA_OK": "1"})["TORCHINDUCTOR_VEC_ISA_OK"] == "1"
    gpu = parse_config({"name": "g", "stages": [{**s, "devices": [0]} for s in stages]}, check_engine_args=False)
    assert "TORCHINDUCTOR_VEC_ISA_OK" not in stage_env(gpu, gpu.stages[0], base={})


# ---- wiring -------------------------------------------------------------------------------------
class SleepingStage(StageHandle):
    """A stage whose process is `sleep`: wiring reads only what a run reported (Ready, Connected)."""

    def _launch(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["sleep", "60"])


def K(sid: int) -> ReplicaKey:  # noqa: N802 - the one replica of stage `sid`
    return ReplicaKey(sid, 0)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[Wiring, dict[ReplicaKey, StageHandle]]]:
    cfg = chain_cfg()
    endpoints = RunEndpoints(cfg.endpoints, new_run_id())
    stages: dict[ReplicaKey, StageHandle] = {
        K(s.id): SleepingStage(cfg, s, "ipc://@nobody-listens", endpoints, tmp_path) for s in cfg.stages
    }
    try:
        yield Wiring(cfg, stages), stages
    finally:
        for h in stages.values():
            h.kill()
            h.wait(5)


def up(w: Wiring, stages: dict[ReplicaKey, StageHandle], sid: int, endpoint: str) -> dict[int, Connect]:
    """A new run of stage `sid` reports itself ready at `endpoint`: the Connects to send, by stage."""
    stages[K(sid)].spawn()
    stages[K(sid)].became_ready(endpoint, {}, time.monotonic())
    return {key.stage_id: connect for key, connect in w.on_ready(K(sid))}


def down(stages: dict[ReplicaKey, StageHandle], sid: int) -> None:
    stages[K(sid)].kill()
    stages[K(sid)].wait(5)
    stages[K(sid)].died(restart_at=None)


def bring_up(w: Wiring, stages: dict[ReplicaKey, StageHandle], sid: int, endpoint: str) -> None:
    for target, connect in up(w, stages, sid, endpoint).items():
        w.on_connected(K(target), connect.downstream)


def test_a_restarted_stage_is_not_wired_before_its_upstream_acknowledges_the_new_connect(
    chain: tuple[Wiring, dict[ReplicaKey, StageHandle]],
) -> None:
    w, stages = chain
    for sid in (2, 1, 0):
        bring_up(w, stages, sid, f"ipc://@s{sid}-0")
    assert w.not_wired() == []
    # Stage 1 dies and comes back: stage 0's old link acknowledgement must not count any more,
    # even if the new incarnation reported the very same address.
    down(stages, 1)
    assert w.not_wired() == [K(0), K(1)]
    assert w.stages_down() == [0, 1]
    connects = up(w, stages, 1, "ipc://@s1-0")
    assert set(connects) == {0, 1}
    assert connects[0].downstream == [StageEndpoint(stage_id=1, endpoint="ipc://@s1-0")]  # only the new address
    assert w.not_wired() == [K(0), K(1)], "wired before the new Connect was handled"
    w.on_connected(K(1), connects[1].downstream)
    assert w.not_wired() == [K(0)]
    # A late acknowledgement of a Connect to an older address does not count either.
    down(stages, 1)
    connects = up(w, stages, 1, "ipc://@s1-1")
    w.on_connected(K(1), connects[1].downstream)
    w.on_connected(K(0), [StageEndpoint(stage_id=1, endpoint="ipc://@s1-0")])
    assert w.not_wired() == [K(0)]
    w.on_connected(K(0), connects[0].downstream)
    assert w.not_wired() == []


def test_acknowledgements_from_a_dead_incarnation_are_ignored(
    chain: tuple[Wiring, dict[ReplicaKey, StageHandle]],
) -> None:
    w, stages = chain
    for sid in (2, 1, 0):
        bring_up(w, stages, sid, f"ipc://@s{sid}-0")
    down(stages, 0)
    w.on_connected(K(0), [StageEndpoint(stage_id=1, endpoint="ipc://@s1-0")])
    assert not w.wired(K(0))
    w.on_connected(K(9), [StageEndpoint(stage_id=77, endpoint="x")])  # unknown ids: ignored, no crash


# ---- request table and admission -----------------------------------------------------------------
def submit(rid: str, **kw: object) -> Submit:
    return Submit(request_id=rid, prompt=kw.pop("prompt", "hello"), **kw)  # type: ignore[arg-type]


def test_request_table_ends_each_request_once_and_keeps_clients_apart() -> None:
    table = RequestTable(max_inflight=2)
    a = table.admit(b"A", submit("r"), time.time(), None, {1})
    b = table.admit(b"B", submit("r"), time.time(), 5.0, {1})  # same id, other client: independent
    assert a.internal_id != b.internal_id
    with pytest.raises(Rejected) as err:
        table.admit(b"A", submit("r"), time.time(), None, {1})
    assert err.value.code == "duplicate_request"
    with pytest.raises(Rejected) as err:
        table.admit(b"C", submit("x"), time.time(), None, {1})
    assert err.value.code == "overloaded"
    assert table.lookup(b"C", "r") is None  # a client reaches only its own requests
    assert table.lookup(b"B", "r") is b
    assert table.pop(a.internal_id) is a and table.pop(a.internal_id) is None
    assert table.of_client(b"B") == [b.internal_id]
    assert table.expired(time.time() + 10) == [b]


@pytest.mark.parametrize(
    ("msg", "code", "needle"),
    [
        (submit("r", prompt=" "), "invalid_input", "`prompt` is empty"),
        (Submit(request_id="r", prompt_token_ids=[]), "invalid_input", "`prompt_token_ids` is empty"),
        (Submit(request_id="r"), "invalid_input", "exactly one of"),
        (
            submit("r", sampling=[StageSampling(stage_id=7, params=SamplingParamsMsg())]),
            "invalid_input",
            "unknown stage id 7",
        ),
        (
            submit("r", sampling=[StageSampling(stage_id=0, params=SamplingParamsMsg())] * 2),
            "invalid_input",
            "stage id 0 given twice",
        ),
    ],
)
def test_check_submit_names_what_is_wrong(msg: Submit, code: str, needle: str) -> None:
    with pytest.raises(Rejected) as err:
        check_submit(chain_cfg(), msg)
    assert err.value.code == code and needle in str(err.value)


@pytest.mark.parametrize("deadline", [float("nan"), float("inf"), -1.0, 0.0])
def test_bad_deadlines_are_refused_while_decoding(deadline: float) -> None:
    body = msgspec.msgpack.encode({"t": "Submit", "request_id": "r", "prompt": "x", "deadline_s": deadline})
    with pytest.raises(ValueError, match="deadline_s"):
        decode([body])


# ---- links ---------------------------------------------------------------------------------------
def test_stage_link_never_blocks_and_sends_control_first() -> None:
    ctx = zmq.Context()
    try:
        endpoint = "ipc://@omni_mp-test-link"
        link = StageLink(MessageSender(ctx, endpoint, LIMITS, hwm=2), LIMITS, max_queue=50)
        t0 = time.monotonic()
        for i in range(100):  # no peer yet: ZMQ takes a few, the rest waits in the outbox, nothing blocks
            link.register(StageRequest(request_id=f"q{i}", stage_id=0, prompt="x"))
        assert time.monotonic() - t0 < 1.0 and link.full()
        in_zmq = 100 - len(link.bulk)
        assert in_zmq < 10
        link.abort("q50", Abort(request_id="q50", reason="x"))  # never sent: dropped, no Abort needed
        link.abort("q1", Abort(request_id="q1", reason="x"))  # sent already: an Abort follows it
        link.send_control(Shutdown(reason="bye"))
        pull = ctx.socket(zmq.PULL)
        pull.bind(endpoint)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 101 and time.monotonic() < deadline:
            link.flush()
            if pull.poll(10):
                got.append(decode(pull.recv_multipart()))
        names = [m.request_id if isinstance(m, StageRequest) else type(m).__name__ for m in got]
        # What ZMQ held goes first; then the control messages, ahead of the outbox's registrations.
        assert names == [f"q{i}" for i in range(in_zmq)] + ["Abort", "Shutdown"] + [
            f"q{i}" for i in range(in_zmq, 100) if i != 50
        ]
        assert not link.pending()
        link.close()
        pull.close(linger=0)
    finally:
        ctx.destroy(linger=0)


def finished(rid: str) -> Finished:
    return Finished(request_id=rid, outputs=[], stage_timings=[], t_submit=0.0, t_finished=0.0)


def test_client_port_keeps_terminal_events_for_a_slow_client_and_bounds_the_rest() -> None:
    ctx = zmq.Context()
    try:
        port = ClientPort(ctx, "ipc://@omni_mp-test-port", LIMITS, queue_len=8, curve=None)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVHWM, 1)
        dealer.connect(port.endpoint)
        dealer.send_multipart(encode(Abort(request_id="hello", reason="")))
        client, _ = _recv_all(port)[0]
        chunk = StageOutputChunk(request_id="s", stage_id=0, token_ids=[1] * 2000)
        refused = 0
        for _ in range(6000):  # more than every queue between us and the client holds (ZMQ's: 4096)
            refused += port.send(client, chunk, droppable=True) == "full"
        assert refused > 0, "the chunks never filled the client's queue"
        for i in range(50):  # terminal events are kept whatever the queue holds
            assert port.send(client, finished(f"r{i}"), droppable=False) is None
        got: list[str] = []
        deadline = time.monotonic() + 20
        while len(got) < 50 and time.monotonic() < deadline:
            port.flush()
            while dealer.poll(5):
                msg = decode(dealer.recv_multipart())
                if isinstance(msg, Finished):
                    got.append(msg.request_id)
        assert got == [f"r{i}" for i in range(50)]
        # A client that disconnects is announced, and sending to it says so.
        dealer.close(linger=0)
        deadline = time.monotonic() + 5
        notices: list[bytes] = []
        while not notices and time.monotonic() < deadline:
            notices = port.disconnected()
            time.sleep(0.01)
        assert notices == [client]
        error = ErrorEvent(request_id="x", stage_id=None, code="c", message="m")
        assert port.send(client, error, droppable=False) == "gone"
        port.close(0)

    finally:
        ctx.destroy(linger=0)


def test_client_port_gives_up_on_a_client_that_never_reads() -> None:
    """Answers are kept for a slow client, but not without bound: past the hard cap the
    client counts as gone (the coordinator ends its requests) and its outbox is freed."""
    ctx = zmq.Context()
    try:
        port = ClientPort(ctx, "ipc://@omni_mp-test-port2", LIMITS, queue_len=8, curve=None, max_inflight=16)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVHWM, 1)
        dealer.connect(port.endpoint)
        dealer.send_multipart(encode(Abort(request_id="hello", reason="")))
        client, _ = _recv_all(port)[0]
        big = ErrorEvent(request_id="x", stage_id=None, code="c", message="m" * 60000)
        results = [port.send(client, big, droppable=False) for _ in range(8000)]
        assert "gone" in results and results.count(None) < 8000
        assert port.disconnected() == [client] and client not in port.outbox
        dealer.close(linger=0)
        port.close(0)
    finally:
        ctx.destroy(linger=0)


def _recv_all(port: ClientPort) -> list[tuple[bytes, object]]:
    out = []
    if port.socket.poll(2000):
        while True:
            try:
                out.append(port.recv())
            except zmq.Again:
                return out
    return out


def test_connect_lists_are_bounded_in_the_type() -> None:
    body = msgspec.msgpack.encode(
        {"t": "Connect", "downstream": [{"stage_id": 1, "endpoint": "x"}] * (MAX_PROCESSES + 1)}
    )
    with pytest.raises(ValueError, match="downstream"):
        decode([body])
    assert isinstance(decode(encode(Connect(downstream=[StageEndpoint(stage_id=1, endpoint="x")]))), Connect)

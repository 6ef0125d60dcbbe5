"""A client whose reply reader fails never leaves anyone waiting (issue 47, item 8).

The fault is injected into the client's decode (the only way a well-formed reply reaches a
bug in the reader: the wire checks everything else), for one reply a raw ROUTER sends where
the coordinator would be. Real ZMQ, a real AsyncOmniClient, and for the HTTP server a real
uvicorn on loopback driven by the official `openai` client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
import uvicorn
import zmq

from omni_mp.client import omni_client
from omni_mp.client.omni_client import AsyncOmniClient, ClientClosed, OmniClient
from omni_mp.config.validate import load_config
from omni_mp.http.app import ServerSettings, create_app
from omni_mp.http.pipeline import PipelineView
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.codec import decode, encode
from omni_mp.wire.messages import Message, StageOutputChunk, StageStatus, StatusReply, StatusRequest, Submit

FAULT = "injected: a decode bug"


class FakeCoordinator:
    """A ROUTER on `endpoint`, on a thread of its own: answers status requests (every stage
    alive and ready), records Submits, and sends what `send` is given."""

    def __init__(self, stages: int = 3) -> None:
        self.endpoint = f"ipc://@omni_mp-test-fault-{uuid.uuid4().hex[:12]}"
        self.stages = stages
        self.submits: list[tuple[bytes, Submit]] = []
        self._outbox: queue.Queue[tuple[bytes, Message]] = queue.Queue(maxsize=16)
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._bound.wait(5)

    def _reply(self, sock: zmq.Socket, ident: bytes, msg: Message) -> None:
        if isinstance(msg, StatusRequest):
            stages = [StageStatus(stage_id=i, pid=1, alive=True, ready=True, restarts=0) for i in range(self.stages)]
            reply = StatusReply(pipeline="fake", stages=stages, inflight=len(self.submits), request_id=msg.request_id)
            sock.send_multipart([ident, *encode(reply)])
        elif isinstance(msg, Submit):
            self.submits.append((ident, msg))

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        self._bound.set()
        try:
            while not self._stop.is_set():
                while not self._outbox.empty():
                    ident, msg = self._outbox.get_nowait()
                    sock.send_multipart([ident, *encode(msg)])
                if sock.poll(20):
                    ident, *frames = sock.recv_multipart()
                    self._reply(sock, ident, decode(frames))
        finally:
            sock.close(linger=0)
            ctx.term()

    def send(self, ident: bytes, msg: Message) -> None:
        self._outbox.put((ident, msg), timeout=5)

    def wait_submits(self, n: int, timeout_s: float = 10.0) -> list[tuple[bytes, Submit]]:
        deadline = time.monotonic() + timeout_s
        while len(self.submits) < n:
            assert time.monotonic() < deadline, f"{len(self.submits)} of {n} submits arrived"
            time.sleep(0.01)
        return list(self.submits)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def fake() -> Iterator[FakeCoordinator]:
    coordinator = FakeCoordinator()
    yield coordinator
    coordinator.close()


@pytest.fixture
def faulty_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's decode raises TypeError on a chunk whose text is 'fault' (any other
    reply decodes as usual)."""
    real = omni_client.decode

    def decode_with_fault(frames: Any, limits: Any, **kwargs: Any) -> Any:
        msg = real(frames, limits, **kwargs)
        if isinstance(msg, StageOutputChunk) and msg.text == "fault":
            raise TypeError(FAULT)
        return msg

    monkeypatch.setattr(omni_client, "decode", decode_with_fault)


def _assert_names_the_cause(err: BaseException) -> None:
    assert isinstance(err, ClientClosed), repr(err)
    assert "reply reader failed" in str(err) and f"TypeError: {FAULT}" in str(err), str(err)
    assert isinstance(err.__cause__, TypeError)


def test_a_failed_reader_fails_every_request_and_closes_the_client(fake: FakeCoordinator, faulty_decode: None) -> None:
    async def scenario() -> None:
        client = AsyncOmniClient(fake.endpoint, arrays="numpy", connect_timeout_s=5)
        try:
            assert (await client.status()).pipeline == "fake"  # the reader works
            streamed: list[Any] = []

            async def stream_one() -> None:
                async for ev in client.stream("hello", request_id="r0"):
                    streamed.append(ev)

            tasks = [asyncio.ensure_future(stream_one())]
            tasks += [asyncio.ensure_future(client.generate("hello", request_id=f"r{i}")) for i in (1, 2)]
            submits = await asyncio.to_thread(fake.wait_submits, 3)
            ident = submits[0][0]
            fake.send(ident, StageOutputChunk(request_id="r0", stage_id=0, token_ids=[1]))  # delivered
            while not streamed:
                await asyncio.sleep(0.01)
            fake.send(ident, StageOutputChunk(request_id="r1", stage_id=0, text="fault"))
            t0 = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            assert time.monotonic() - t0 < 2.0  # all at once, not by some timeout
            for err in results:
                _assert_names_the_cause(err)
            assert client.closed and f"TypeError: {FAULT}" in (client.closed_reason or "")
            # Every later call raises at once, and nothing more reaches the pipeline.
            for call in (client.generate("again"), client.status(), client.abort("r0")):
                with pytest.raises(ClientClosed) as got:
                    await asyncio.wait_for(call, 1)
                _assert_names_the_cause(got.value)
            await asyncio.sleep(0.2)
            assert len(fake.submits) == 3
        finally:
            await client.close()
        assert client.closed_reason is not None and "reply reader failed" in client.closed_reason

    asyncio.run(scenario())


def test_the_sync_client_says_it_is_closed(fake: FakeCoordinator, faulty_decode: None) -> None:
    with OmniClient(fake.endpoint, connect_timeout_s=5) as client:
        assert not client.closed and client.closed_reason is None
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.generate, "hello", request_id="s0")
            ident = fake.wait_submits(1)[0][0]
            fake.send(ident, StageOutputChunk(request_id="s0", stage_id=0, text="fault"))
            with pytest.raises(ClientClosed) as got:
                pending.result(10)
        _assert_names_the_cause(got.value)
        assert client.closed
        with pytest.raises(ClientClosed):
            client.status()
    assert client.closed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _http_server(endpoint: str) -> Iterator[str]:
    """The app as `python -m omni_mp.http` makes it (the tiny Qwen2.5-Omni pipeline's view),
    served by uvicorn on a thread of this process, where the fault is injected."""
    cfg = load_config(CONFIG_DIR / "tiny_qwen2_5_omni.yaml")
    settings = ServerSettings(endpoint=endpoint, model=cfg.name)
    app = create_app(settings, PipelineView.of(cfg), None, lambda: AsyncOmniClient(endpoint, connect_timeout_s=5))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive()


def test_the_http_server_reports_a_failed_client(fake: FakeCoordinator, faulty_decode: None) -> None:
    with _http_server(fake.endpoint) as url:
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30)
        messages = [{"role": "user", "content": "hello"}]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(api.chat.completions.create, model="tiny", messages=messages)
            ident, submit = fake.wait_submits(1)[0]
            fake.send(ident, StageOutputChunk(request_id=submit.request_id, stage_id=0, text="fault"))
            with pytest.raises(openai.APIStatusError) as in_flight:
                pending.result(10)
        assert in_flight.value.status_code == 503
        assert f"TypeError: {FAULT}" in in_flight.value.message
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503
        reason = health.json()["reason"]
        assert "coordinator client is closed" in reason and f"TypeError: {FAULT}" in reason
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as later:
            api.chat.completions.create(model="tiny", messages=messages)
        assert later.value.status_code == 503 and time.monotonic() - t0 < 2.0
        assert later.value.code == "client_closed"
        assert len(fake.submits) == 1

"""A tcp pipeline with CURVE keys (one real stage process): listed clients are served; a peer
without keys, or with keys not listed, can neither submit, nor abort others' requests, nor
inject frames into the stage links or the coordinator's event socket."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import zmq

from omni_mp.client.omni_client import OmniClient
from omni_mp.config.validate import parse_config
from omni_mp.control.coordinator import Coordinator
from omni_mp.wire.codec import encode
from omni_mp.wire.keys import client_identity, generate
from omni_mp.wire.messages import Abort, ErrorEvent, SamplingParamsMsg, Shutdown, Submit

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Coordinator, Path]]:
    keys = tmp_path_factory.mktemp("keys")
    generate(keys, ["alice", "mallory"])
    (keys / "clients" / "mallory.key").unlink()  # mallory has a keypair, but is not listed
    cfg = parse_config(
        {
            "name": "curve",
            "endpoints": {"transport": "tcp", "host": "127.0.0.1"},
            "security": {"keys": str(keys)},
            "stages": [
                {
                    "id": 0,
                    "model": "tiny-qwen2",
                    "final_output": True,
                    "engine_args": {
                        "dtype": "float32",
                        "enforce_eager": True,
                        "max_model_len": 2048,
                        "max_num_seqs": 4,
                    },
                    "sampling": {"max_tokens": 8, "ignore_eos": True},
                }
            ],
        }
    )
    coord = Coordinator(cfg, client_bind="tcp://127.0.0.1:*")
    coord.start()
    runner = threading.Thread(target=coord.run)
    runner.start()
    try:
        yield coord, keys
    finally:
        coord.stop()
        runner.join(60)


def _plain_peer(ctx: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def test_listed_clients_are_served_and_nobody_else_gets_in(secured: tuple[Coordinator, Path]) -> None:
    coord, keys = secured
    assert coord.client_endpoint.startswith("tcp://")
    long = {0: SamplingParamsMsg(max_tokens=1500, ignore_eos=True)}
    with OmniClient(coord.client_endpoint, keys=client_identity(keys, "alice")) as alice:
        stage = alice.status().stages[0]
        assert stage.info["input"].startswith("tcp://")
        # alice's long request runs while the others try their luck.
        stream = alice.stream("Hello", sampling=long, request_id="victim", timeout_s=120)
        assert next(stream) is not None
        ctx = zmq.Context()
        try:
            nokeys = _plain_peer(ctx, zmq.DEALER, coord.client_endpoint)
            nokeys.send_multipart(encode(Submit(request_id="x1", prompt="Hello")))
            nokeys.send_multipart(encode(Abort(request_id="victim", reason="evil")))
            mallory = ctx.socket(zmq.DEALER)
            mallory.setsockopt(zmq.LINGER, 0)
            client_identity(keys, "mallory").client(mallory)
            mallory.connect(coord.client_endpoint)
            mallory.send_multipart(encode(Submit(request_id="x2", prompt="Hello")))
            mallory.send_multipart(encode(Abort(request_id="victim", reason="evil")))
            # Stage frames: a Shutdown into the stage's input, an error for the request in
            # flight into the coordinator's event socket.
            stage_in = _plain_peer(ctx, zmq.PUSH, stage.info["input"])
            stage_in.send_multipart(encode(Shutdown(reason="injected")), flags=zmq.NOBLOCK)
            events = _plain_peer(ctx, zmq.PUSH, coord.events.socket.getsockopt_string(zmq.LAST_ENDPOINT))
            forged = ErrorEvent(request_id="q0", stage_id=0, code="forged", message="x")
            events.send_multipart(encode(forged), flags=zmq.NOBLOCK)
            time.sleep(2.0)
            assert not nokeys.poll(0) and not mallory.poll(0), "an unlisted peer got an answer"
            status = alice.status()
            assert status.inflight == 1, "a request from an unlisted peer was admitted, or the victim ended"
            assert status.stages[0].alive and psutil.Process(status.stages[0].pid).is_running()
        finally:
            ctx.destroy(linger=0)
        events_seen = list(stream)  # the victim runs to its end: nobody else could abort or fail it
        assert len(events_seen[-1].outputs[0].token_ids) == 1500
        assert len(alice.generate("Hello", timeout_s=60).outputs[0].token_ids) == 8

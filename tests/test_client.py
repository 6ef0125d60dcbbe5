"""The client library against a scripted coordinator socket (a real ROUTER, real messages):
bounded per-request queues, status replies matched to their requests, close() answers waiters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import zmq
import zmq.asyncio

from omni_mp.client.omni_client import STREAM_QUEUE, AsyncOmniClient, RequestError
from omni_mp.wire.codec import decode, encode
from omni_mp.wire.messages import Abort, StageOutputChunk, StatusReply, StatusRequest, Submit
from tests.audio_server import audio_round_trip
from tests.launcher import REPO


async def _serve(router: zmq.asyncio.Socket, seen: list[object]) -> None:
    """Streams STREAM_QUEUE + 100 chunks for a Submit whose id starts with "s"; answers a status request with a
    stray reply first, then its own."""
    while True:
        ident, *frames = await router.recv_multipart()
        msg = decode(frames)
        seen.append(msg)
        if isinstance(msg, Submit) and msg.request_id.startswith("s"):
            for _ in range(STREAM_QUEUE + 100):
                chunk = StageOutputChunk(request_id=msg.request_id, stage_id=0, token_ids=[1])
                await router.send_multipart([ident, *encode(chunk)])
        elif isinstance(msg, StatusRequest):
            for tag in ("someone-else", msg.request_id):
                reply = StatusReply(pipeline=str(tag), stages=[], inflight=0, request_id=tag)
                await router.send_multipart([ident, *encode(reply)])


def test_a_stream_not_read_ends_with_slow_consumer_and_status_is_matched() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.SNDHWM, 0)  # keep every chunk (a ROUTER drops at its HWM)
        router.bind("ipc://@omni_mp-test-client")
        seen: list[object] = []
        server = asyncio.create_task(_serve(router, seen))
        client = AsyncOmniClient("ipc://@omni_mp-test-client")
        try:
            stream = client.stream("x", request_id="s1")
            first = await stream.__anext__()  # then stop reading for a while
            assert isinstance(first, StageOutputChunk)
            await asyncio.sleep(1.0)
            got = 1
            with pytest.raises(RequestError) as err:
                async for _ in stream:
                    got += 1
            assert err.value.code == "slow_consumer" and got <= STREAM_QUEUE + 1
            for _ in range(50):
                if any(isinstance(m, Abort) and m.request_id == "s1" for m in seen):
                    break
                await asyncio.sleep(0.05)
            assert any(isinstance(m, Abort) and m.request_id == "s1" for m in seen), "the pipeline was not told"
            status = await client.status(timeout_s=5)
            assert status.request_id is not None and status.request_id.startswith("status-")
            # close() answers a request still waiting, instead of leaving it hanging.
            waiting = asyncio.create_task(client.generate("y", request_id="r2"))
            await asyncio.sleep(0.2)
            await client.close()
            with pytest.raises(RequestError) as err:
                await waiting
            assert err.value.code == "client_closed"
        finally:
            server.cancel()
            router.close(linger=0)
            ctx.term()

    asyncio.run(asyncio.wait_for(main(), 30))


# ---- a client without torch ---------------------------------------------------------------------
TORCH_FREE_SCRIPT = """
import sys
import omni_mp.client.omni_client
assert "torch" not in sys.modules and "vllm" not in sys.modules, "imported on import"
import numpy as np
from tests.audio_server import audio_round_trip
whole = np.arange(6, dtype=np.float32) / 8
audio, chunks = audio_round_trip(sys.argv[1], None, whole, [whole[:2], whole[2:]])
assert type(audio) is np.ndarray and np.array_equal(audio, whole), audio
assert [type(c[0]) for c in chunks] == [np.ndarray] * 2 and [c[1] for c in chunks] == [24000] * 2
assert np.array_equal(np.concatenate([c[0] for c in chunks]), whole)
assert "torch" not in sys.modules and "vllm" not in sys.modules, "imported while serving"
print("ok")
"""


def test_the_client_imports_neither_torch_nor_vllm_and_gets_numpy_arrays() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_FREE_SCRIPT, f"ipc://@omni_mp-test-client-np-{os.getpid()}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_arrays_picks_numpy_or_torch_and_bfloat16_arrives_as_torch() -> None:
    whole = torch.linspace(-1, 1, 6)
    endpoint = f"ipc://@omni_mp-test-client-arrays-{os.getpid()}"
    audio, chunks = audio_round_trip(endpoint, "numpy", whole, [whole[:3], whole[3:]])
    assert type(audio) is np.ndarray and np.array_equal(audio, whole.numpy())
    assert [type(c[0]) for c in chunks] == [np.ndarray] * 2
    audio, chunks = audio_round_trip(endpoint, None, whole, [whole[:3], whole[3:]])  # torch is imported here
    assert isinstance(audio, torch.Tensor) and torch.equal(audio, whole)
    assert all(isinstance(c[0], torch.Tensor) for c in chunks)
    audio, _ = audio_round_trip(endpoint, "numpy", whole.to(torch.bfloat16), [])  # numpy has no bfloat16
    assert isinstance(audio, torch.Tensor) and torch.equal(audio, whole.to(torch.bfloat16))

"""A scripted coordinator that answers every Submit with audio, for client tests. Imports no
torch, so that a test can run it in a process that must stay without torch."""

from __future__ import annotations

import asyncio
import threading

import zmq
import zmq.asyncio

from omni_mp.client.omni_client import OmniClient
from omni_mp.wire.codec import NUMPY_ARRAYS, decode, encode
from omni_mp.wire.messages import Finished, StageOutputChunk, StageResult, Submit


async def _serve_audio(router: zmq.asyncio.Socket, arrays: dict[str, object]) -> None:
    """Answers each Submit with two audio chunks and a Finished, with the arrays given."""
    while True:
        ident, *frames = await router.recv_multipart()
        msg = decode(frames, arrays=NUMPY_ARRAYS)
        if not isinstance(msg, Submit):
            continue
        for part in arrays["parts"]:  # type: ignore[attr-defined]
            info = {"audio": part, "sample_rate": 24000}
            chunk = StageOutputChunk(request_id=msg.request_id, stage_id=0, additional_information=info)
            await router.send_multipart([ident, *encode(chunk)])
        out = StageResult(stage_id=0, audio=arrays["whole"], sample_rate=24000)
        done = Finished(request_id=msg.request_id, outputs=[out], stage_timings=[], t_submit=0.0, t_finished=0.0)
        await router.send_multipart([ident, *encode(done)])


def audio_round_trip(endpoint: str, kind: str | None, whole: object, parts: list[object]) -> tuple[object, list]:
    """(Finished audio, stream_audio chunks) as a client with `arrays=kind` receives them."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    bound = threading.Event()

    async def serve() -> None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        bound.set()
        server = asyncio.create_task(_serve_audio(router, {"whole": whole, "parts": parts}))
        await stop.wait()
        server.cancel()
        router.close(linger=0)
        ctx.term()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert bound.wait(10)
    try:
        with OmniClient(endpoint, arrays=kind) as client:  # type: ignore[arg-type]
            done = client.generate("x", timeout_s=10)
            chunks = list(client.stream_audio("y", timeout_s=10))
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
    return done.outputs[0].audio, chunks

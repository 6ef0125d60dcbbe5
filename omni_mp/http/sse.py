"""Server-sent events: a chat stream as `chat.completion.chunk` events, `data: [DONE]` last;
and a streaming response that aborts its request as soon as the client disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omni_mp.http.audio_out import b64
from omni_mp.http.chat import AudioDelta, ChatEnd, TextDelta
from omni_mp.http.errors import ApiError
from omni_mp.http.schemas import ChatCompletionChunk, ChunkChoice, Delta, DeltaAudio, to_json

DONE = b"data: [DONE]\n\n"


def event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


@dataclass(frozen=True)
class ChunkMeta:
    id: str
    created: int
    model: str
    audio_id: str | None  # set when the answer is spoken
    include_usage: bool


def _chunk(meta: ChunkMeta, delta: Delta, finish_reason: str | None = None) -> bytes:
    choice = ChunkChoice(index=0, delta=delta, finish_reason=finish_reason)
    return event(to_json(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[choice])))


async def chat_events(meta: ChunkMeta, events: AsyncIterator[TextDelta | AudioDelta | ChatEnd]) -> AsyncIterator[bytes]:
    """Text in `delta.content`, audio in `delta.audio.data` (base64 PCM16) as produced; the
    whole transcript in a last `delta.audio`; then `finish_reason`, usage if asked, [DONE].
    An error after the first event is sent as an `error` event (the status is gone by then)."""
    yield _chunk(meta, Delta(role="assistant", content=""))
    try:
        async for ev in events:
            if isinstance(ev, TextDelta):
                yield _chunk(meta, Delta(content=ev.text))
            elif isinstance(ev, AudioDelta):
                assert meta.audio_id is not None
                yield _chunk(meta, Delta(audio=DeltaAudio(id=meta.audio_id, data=b64(ev.pcm))))
            else:
                if meta.audio_id is not None:
                    yield _chunk(meta, Delta(audio=DeltaAudio(id=meta.audio_id, transcript=ev.text)))
                yield _chunk(meta, Delta(), ev.finish_reason)
                if meta.include_usage:
                    last = ChatCompletionChunk(
                        id=meta.id, created=meta.created, model=meta.model, choices=[], usage=ev.usage
                    )
                    yield event(to_json(last))
    except ApiError as err:
        yield event(to_json(err.body))
        return
    yield DONE


class AbortingStream(StreamingResponse):
    """Streams until done or until the client disconnects, whichever comes first; then
    closes the body iterator, whose cleanup aborts the request in the pipeline. (Plain
    asyncio cancellation: delivered once, so the cleanup's own awaits run.)"""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.ensure_future(self.stream_response(send))
        watching = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sending, watching):
                task.cancel()
            for task in (sending, watching):
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await task  # a client gone mid-send (OSError) is a disconnection too
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def cancel_on_disconnect(receive: Receive, work: asyncio.Future) -> object:  # type: ignore[type-arg]
    """The result of `work`, or None after cancelling it if the client disconnects first."""
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({work, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return None
    return work.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass

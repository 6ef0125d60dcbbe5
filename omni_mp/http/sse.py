"""Server-sent events: a chat stream as `chat.completion.chunk` events, `data: [DONE]` last;
and a streaming response that aborts its request as soon as the client disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omni_mp.http.audio_ids import AudioStore
from omni_mp.http.audio_out import b64
from omni_mp.http.chat import AudioDelta, ChatEnd, TextDelta, ToolCallsDelta
from omni_mp.http.errors import ApiError
from omni_mp.http.schemas import ChatCompletionChunk, ChunkChoice, Delta, DeltaAudio, to_json

DONE = b"data: [DONE]\n\n"


def event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class SpokenAnswer:
    """A spoken answer's audio id: issued when the request starts (a stream names it and its
    `expires_at` in its first audio delta), resolvable once the answer is stored at its end."""

    def __init__(self, store: AudioStore) -> None:
        self._store = store
        self.id = store.new_id()
        self.expires_at = store.expiry()

    def store(self, end: ChatEnd) -> None:
        """Keep what the model needs to continue: the answer's spoken text (tool calls excluded)."""
        self._store.put(self.id, end.content or "", self.expires_at)


@dataclass(frozen=True)
class ChunkMeta:
    id: str
    created: int
    model: str
    spoken: SpokenAnswer | None  # set when the answer is spoken
    include_usage: bool


def _chunk(meta: ChunkMeta, delta: Delta, finish_reason: str | None = None) -> bytes:
    choice = ChunkChoice(index=0, delta=delta, finish_reason=finish_reason)
    return event(to_json(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[choice])))


def _end_chunks(meta: ChunkMeta, end: ChatEnd, spoken: bool) -> list[bytes]:
    out = []
    if meta.spoken is not None and spoken:
        meta.spoken.store(end)
        out.append(_chunk(meta, Delta(audio=DeltaAudio(id=meta.spoken.id, transcript=end.content or ""))))
    out.append(_chunk(meta, Delta(), end.finish_reason))
    if meta.include_usage:
        last = ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[], usage=end.usage)
        out.append(event(to_json(last)))
    return out


async def chat_events(
    meta: ChunkMeta, events: AsyncIterator[TextDelta | ToolCallsDelta | AudioDelta | ChatEnd]
) -> AsyncIterator[bytes]:
    """Text in `delta.content`, tool calls in `delta.tool_calls`, audio in `delta.audio.data`
    (base64 PCM16; the first with the id's `expires_at`) as produced; the spoken transcript in a
    last `delta.audio`; then `finish_reason`, usage if asked, [DONE]. An error after the first
    event is sent as an `error` event (the status is gone by then)."""
    yield _chunk(meta, Delta(role="assistant", content=""))
    spoken = False
    try:
        async for ev in events:
            if isinstance(ev, TextDelta):
                yield _chunk(meta, Delta(content=ev.text))
            elif isinstance(ev, ToolCallsDelta):
                yield _chunk(meta, Delta(tool_calls=ev.calls))
            elif isinstance(ev, AudioDelta):
                assert meta.spoken is not None
                expires = None if spoken else meta.spoken.expires_at
                spoken = True
                yield _chunk(meta, Delta(audio=DeltaAudio(id=meta.spoken.id, data=b64(ev.pcm), expires_at=expires)))
            else:
                for chunk in _end_chunks(meta, ev, spoken):
                    yield chunk
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

"""A request's event stream, wrapped: pipeline errors become `ApiError`s, metrics are taken
(time to first audio, audio seconds, outcome), and the first event is awaited before any
response starts, so an early failure still gets its own HTTP status."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TypeVar

from omni_mp.client.omni_client import RequestError
from omni_mp.http.chat import AudioDelta, ChatEnd, TextDelta, ToolCallsDelta
from omni_mp.http.errors import ApiError, from_request_error
from omni_mp.http.metrics import Metrics

ChatEvent = TextDelta | ToolCallsDelta | AudioDelta | ChatEnd
T = TypeVar("T")


async def as_api_errors(events: AsyncIterator[ChatEvent], prompt_param: str | None = None) -> AsyncIterator[ChatEvent]:
    """`prompt_param`: the request field a prompt too long for the model is blamed on."""
    try:
        async for ev in events:
            yield ev
    except RequestError as err:
        raise from_request_error(err, prompt_param) from None
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def tracked(
    metrics: Metrics, endpoint: str, t0: float, events: AsyncIterator[ChatEvent]
) -> AsyncIterator[ChatEvent]:
    code, audio_s, first_audio = "client_disconnected", 0.0, True
    try:
        async for ev in events:
            if isinstance(ev, AudioDelta):
                if first_audio:
                    metrics.first_audio.labels(endpoint=endpoint).observe(time.monotonic() - t0)
                    first_audio = False
                audio_s += len(ev.pcm) / 2 / ev.sample_rate
            elif isinstance(ev, ChatEnd):
                metrics.stage_timings(ev.timings)
                code = "ok"
            yield ev
    except ApiError as err:
        code = err.code
        raise
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        wall = time.monotonic() - t0
        metrics.outcome(endpoint, code)
        metrics.latency.labels(endpoint=endpoint).observe(wall)
        if audio_s > 0:
            metrics.audio_seconds.inc(audio_s)
            metrics.rtf.labels(endpoint=endpoint).observe(wall / audio_s)


async def primed(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """`events` with its first item already received (raising here, before any response)."""
    first = await events.__anext__()

    async def rest() -> AsyncIterator[T]:
        try:
            yield first
            async for ev in events:
                yield ev
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    return rest()

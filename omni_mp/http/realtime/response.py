"""One realtime response: the chat pipeline's stream (omni_mp.http.chat.run_chat) -> Realtime
server events: the assistant message (audio deltas in the session's output format: PCM16 at
24 kHz or G.711 at 8 kHz, resampled from the talker's rate by soxr, streamed; its transcript or its
text), function calls (`response.function_call_arguments.*`, never spoken), `response.done`
with usage. Cancelling the task that runs it closes the stream, which aborts the request in
every stage (run_chat's cleanup); `finish` then says how it ended."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np

from omni_mp.http.audio_out import SAMPLE_RATE, b64
from omni_mp.http.chat import AudioDelta, ChatEnd, TextDelta, ToolCallsDelta
from omni_mp.http.errors import ApiError
from omni_mp.http.realtime.events import ErrorBody, Usage
from omni_mp.http.realtime.history import History, HistoryItem, new_id
from omni_mp.http.realtime.wire_audio import PCM16, WireFormat, encode

Send = Callable[..., Awaitable[None]]


class _Resampler:
    """PCM16 at the talker's rate -> int16 samples at `out_rate` (soxr, streamed); a no-op at it."""

    def __init__(self, out_rate: int = SAMPLE_RATE) -> None:
        self._stream: Any = None
        self._rate = out_rate
        self.out_rate = out_rate

    def __call__(self, pcm: bytes, rate: int) -> np.ndarray:
        samples = np.frombuffer(pcm, dtype="<i2")
        if rate == self.out_rate:
            return samples
        import soxr

        if self._stream is None or rate != self._rate:
            self._stream, self._rate = soxr.ResampleStream(rate, self.out_rate, 1, dtype="int16"), rate
        return self._stream.resample_chunk(samples).astype("<i2")

    def flush(self) -> np.ndarray:
        """What the resampler still holds (its filter's delay), at the answer's end."""
        if self._stream is None:
            return np.zeros(0, np.int16)
        tail = self._stream.resample_chunk(np.zeros(0, np.int16), last=True).astype("<i2")
        self._stream = None
        return tail


class ResponseRun:
    def __init__(self, send: Send, history: History, audio: bool, metadata: dict[str, str] | None,
                 out_format: WireFormat = PCM16) -> None:  # fmt: skip
        self.id = new_id("resp")
        self.send = send
        self.history = history
        self.audio = audio
        self.metadata = metadata
        self.message: HistoryItem | None = None
        self.calls: dict[int, HistoryItem] = {}
        self.usage = Usage(0, 0, 0)
        self.status = "in_progress"
        self.first_audio_at: float | None = None
        self.audio_samples = 0  # at the output format's rate
        self.out_format = out_format
        self._resample = _Resampler(out_format.rate)

    def describe(self, status: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "object": "realtime.response", "id": self.id, "status": status or self.status,
            "output_modalities": ["audio"] if self.audio else ["text"], "conversation_id": "conv_default",
            "output": [self._item_json(it) for it in self._outputs()],
            "metadata": self.metadata,
        }  # fmt: skip
        if status is not None and status != "in_progress":
            out["usage"] = self.usage
        return out

    def _outputs(self) -> list[HistoryItem]:
        return ([self.message] if self.message else []) + [self.calls[k] for k in sorted(self.calls)]

    def _item_json(self, it: HistoryItem) -> dict[str, Any]:
        if it.type == "function_call":
            return {"id": it.id, "object": "realtime.item", "type": "function_call", "status": it.status,
                    "call_id": it.call_id, "name": it.name, "arguments": it.arguments}  # fmt: skip
        part = (
            {"type": "output_audio", "transcript": it.text} if self.audio else {"type": "output_text", "text": it.text}
        )
        return {"id": it.id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": it.status, "content": [part]}  # fmt: skip

    async def _add_item(self, it: HistoryItem, index: int) -> None:
        previous = self.history.last_id()
        for gone in self.history.add(it):
            await self.send("conversation.item.deleted", item_id=gone)
        await self.send("response.output_item.added", response_id=self.id, output_index=index, item=self._item_json(it))
        await self.send("conversation.item.added", previous_item_id=previous, item=self._item_json(it))

    async def _message(self) -> HistoryItem:
        if self.message is None:
            self.message = HistoryItem(new_id("item"), "message", "assistant", status="in_progress")
            await self._add_item(self.message, 0)
            part = {"type": "audio", "transcript": ""} if self.audio else {"type": "text", "text": ""}
            await self.send("response.content_part.added", **self._at(self.message), part=part)
        return self.message

    def _at(self, it: HistoryItem) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": it.id, "output_index": 0, "content_index": 0}

    async def run(self, events: AsyncIterator[Any]) -> None:
        """Send the answer's events as they come (the caller sends `response.created` before)."""
        async for ev in events:
            if isinstance(ev, TextDelta):
                msg = await self._message()
                msg.text += ev.text
                kind = "response.output_audio_transcript.delta" if self.audio else "response.output_text.delta"
                await self.send(kind, **self._at(msg), delta=ev.text)
            elif isinstance(ev, AudioDelta):
                if self.first_audio_at is None:
                    self.first_audio_at = time.monotonic()
                await self._audio(self._resample(ev.pcm, ev.sample_rate))
            elif isinstance(ev, ToolCallsDelta):
                await self._call_deltas(ev)
            elif isinstance(ev, ChatEnd):
                tail = self._resample.flush()
                if len(tail):
                    await self._audio(tail)
                await self._end(ev)

    async def _audio(self, pcm: np.ndarray) -> None:
        """An audio delta of int16 samples at the output format's rate."""
        msg = await self._message()
        self.audio_samples += len(pcm)
        msg.audio_ms = self.audio_samples * 1000 // self.out_format.rate
        await self.send("response.output_audio.delta", **self._at(msg), delta=b64(encode(self.out_format, pcm)))

    async def _call_deltas(self, ev: ToolCallsDelta) -> None:
        for d in ev.calls:
            call = self.calls.get(d.index)
            if call is None:
                name = d.function.name if d.function is not None else None
                # Our own id (29 characters), not vLLM's: clients shorten ids over 32 characters.
                call = HistoryItem(
                    new_id("item"), "function_call", call_id=new_id("call"), name=name, status="in_progress"
                )
                self.calls[d.index] = call
                await self._add_item(call, 1 + d.index)
            args = d.function.arguments if d.function is not None else None
            if args:
                call.arguments += args
                await self.send("response.function_call_arguments.delta", response_id=self.id, item_id=call.id,
                                output_index=1 + d.index, call_id=call.call_id, delta=args)  # fmt: skip

    async def _end(self, end: ChatEnd) -> None:
        u = end.usage
        self.usage = Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens)
        for k, final in enumerate(end.tool_calls):
            call = self.calls.get(k)
            if call is None:  # (a call the stream did not show: the final parse found it)
                call = HistoryItem(new_id("item"), "function_call", call_id=new_id("call"), name=final.function.name)
                self.calls[k] = call
                await self._add_item(call, 1 + k)
            call.arguments, call.name = final.function.arguments, final.function.name
        if self.message is not None and end.content is not None and end.tool_calls:
            self.message.text = end.content.strip()  # the spoken text, without the calls
        self.status = "completed"

    async def finish(self, status: str, error: ErrorBody | None = None, reason: str = "client_cancelled") -> None:
        """The closing events: the items done, then `response.done` with `status`."""
        self.status = status
        msg = self.message
        if msg is not None:
            msg.status = "completed" if status == "completed" else "incomplete"
            at = self._at(msg)
            if self.audio:
                await self.send("response.output_audio.done", **at)
                await self.send("response.output_audio_transcript.done", **at, transcript=msg.text)
                part = {"type": "audio", "transcript": msg.text}
            else:
                await self.send("response.output_text.done", **at, text=msg.text)
                part = {"type": "text", "text": msg.text}
            await self.send("response.content_part.done", **at, part=part)
            await self.send("response.output_item.done", response_id=self.id, output_index=0, item=self._item_json(msg))
            await self.send("conversation.item.done", item=self._item_json(msg))
        for k in sorted(self.calls):
            call = self.calls[k]
            call.status = "completed" if status == "completed" else "incomplete"
            at = {"response_id": self.id, "item_id": call.id, "output_index": 1 + k, "call_id": call.call_id}
            await self.send("response.function_call_arguments.done", **at, name=call.name, arguments=call.arguments)
            await self.send(
                "response.output_item.done", response_id=self.id, output_index=1 + k, item=self._item_json(call)
            )
        body = self.describe(status)
        if error is not None:
            body["status_details"] = {
                "type": "failed",
                "error": {"type": error.type, "code": error.code, "message": error.message},
            }
        elif status == "cancelled":
            body["status_details"] = {"type": "cancelled", "reason": reason}
        await self.send("response.done", response=body)


def api_error_body(err: ApiError) -> ErrorBody:
    e = err.body.error
    return ErrorBody(type=e.type, code=e.code or e.type, message=e.message, param=e.param)

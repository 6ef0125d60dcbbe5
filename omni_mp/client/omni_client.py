"""Clients for a running coordinator: `AsyncOmniClient` (asyncio) and `OmniClient` (sync).

Both speak the same msgspec messages over one ZMQ DEALER socket. The sync client runs an
`AsyncOmniClient` on a private event-loop thread, so there is one implementation and the
sync client is safe to call from many threads at once.

    with OmniClient("ipc://@omni_mp-...-client") as client:
        done = client.generate("Hello", deadline_s=30)
        print(done.outputs[-1].text)
        for chunk in client.stream("Hello"):
            print(chunk.token_ids)

Importing this module imports neither torch nor vLLM. Tensors in replies (audio, hidden
states) arrive as numpy arrays, or as torch tensors when torch is already imported in the
process when the client is made; `arrays="numpy"` or `"torch"` chooses explicitly. (numpy
has no bfloat16: a bfloat16 tensor arrives as torch either way.) Requests may carry numpy
arrays or torch tensors.

Nothing waits silently: every argument is checked before anything is sent (an
`InvalidRequest`, a ValueError, naming it; media by the rules in `media_files`, multi-channel audio included); a request
waits at most `connect_timeout_s` (default 10 s) for a connection to the endpoint (a
`TimeoutError` naming it); a CURVE handshake that fails (missing, wrong or unlisted keys)
raises `HandshakeError` at once, saying what to check; a connection lost mid-request fails
the requests in flight with a `ConnectionError`. A client whose reply reader fails (anything
but a corrupt message, which is dropped) is closed: every request in flight fails at once
with `ClientClosed` naming the cause, `closed` says so, and every later call raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import zmq
import zmq.asyncio

from omni_mp.client.args import (
    check_forced_reply,
    check_names,
    check_prompt,
    check_seconds,
    request_params,
    stage_sampling,
)
from omni_mp.client.link import DEFAULT_CONNECT_TIMEOUT_S, HandshakeError, LinkWatch
from omni_mp.client.media import AudioLike, ImageLike, multi_modal_input
from omni_mp.wire.codec import NUMPY_ARRAYS, ArrayCodec, Limits, PayloadError, decode, encode, torch_arrays
from omni_mp.wire.keys import CurveIdentity
from omni_mp.wire.messages import (
    Abort,
    ErrorEvent,
    Finished,
    PromptEmbeds,
    SamplingParamsMsg,
    StageOutputChunk,
    StatusReply,
    StatusRequest,
    Submit,
)
from omni_mp.wire.outputs import ImageChunk, chunk_audio, chunk_image, final_image

if TYPE_CHECKING:
    import numpy as np
    import torch

ArrayKind = Literal["numpy", "torch"]
__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "AsyncOmniClient",
    "ClientClosed",
    "HandshakeError",
    "ImageChunk",
    "InvalidRequest",
    "OmniClient",
    "RequestError",
]


log = logging.getLogger("omni_mp.client")


def _array_codec(kind: ArrayKind | None) -> ArrayCodec:
    """None: torch if the process has already imported it, numpy otherwise."""
    if kind is None:
        kind = "torch" if "torch" in sys.modules else "numpy"
    return torch_arrays() if kind == "torch" else NUMPY_ARRAYS


class RequestError(RuntimeError):
    """A request ended with an error event from the pipeline."""

    def __init__(self, event: ErrorEvent) -> None:
        where = "coordinator" if event.stage_id is None else f"stage {event.stage_id}"
        super().__init__(f"request {event.request_id!r} failed in {where}: {event.code}: {event.message}")
        self.event = event
        self.code = event.code
        self.stage_id = event.stage_id


class InvalidRequest(RequestError, ValueError):
    """A request's arguments refused (code `invalid_input`), by the client before anything is
    sent (`client_side`, `stage_id` None) or by the pipeline (e.g. a stage id in `sampling`
    it does not have): the message names the argument. Both a RequestError and a ValueError."""

    def __init__(self, event: ErrorEvent, client_side: bool = False) -> None:
        super().__init__(event)
        self.client_side = client_side
        if client_side:
            self.args = (f"request {event.request_id!r}: {event.message}",)

    @classmethod
    def refused(cls, request_id: str, err: ValueError) -> InvalidRequest:
        event = ErrorEvent(request_id=request_id, stage_id=None, code="invalid_input", message=str(err))
        return cls(event, client_side=True)


def _request_error(event: ErrorEvent) -> RequestError:
    return InvalidRequest(event) if event.code == "invalid_input" else RequestError(event)


class ClientClosed(ConnectionError):
    """The client serves no more requests: `close()` was called, or a task it needs (the reply
    reader, the link watcher) failed; the message names why, `__cause__` is the failure."""


class _Lost(NamedTuple):
    """Queued for a request whose connection broke: the error it raises."""

    error: Exception


_Event = StageOutputChunk | Finished | ErrorEvent

# Events buffered per request before the caller reads them: a caller that stops reading a
# stream (while others keep theirs going) ends that request with `slow_consumer` instead of
# growing memory. Non-streaming requests get a single event.
STREAM_QUEUE = 4096
_MAX_CAUSE = 500  # characters of a failure's message quoted in `closed_reason`


class AsyncOmniClient:
    """`keys`: this client's CURVE identity (keys.client_identity(DIR, NAME)); required by
    pipelines with `security.keys` (every tcp endpoint). `arrays`: what received tensors
    are (see the module docstring). `connect_timeout_s`: how long a request waits for a
    connection to the endpoint before it fails with a TimeoutError naming it."""

    def __init__(
        self,
        endpoint: str,
        *,
        limits: Limits | None = None,
        keys: CurveIdentity | None = None,
        arrays: ArrayKind | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        check_seconds("connect_timeout_s", connect_timeout_s)
        self.endpoint = endpoint
        self.limits = limits or Limits()
        self._arrays = _array_codec(arrays)
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_bytes)
        if keys is not None:
            keys.client(self._sock)
        # (before connect: the monitor sees every event of the connection)
        self._link = LinkWatch(self._sock, endpoint, keys is not None, connect_timeout_s)
        self._sock.connect(endpoint)
        self._queues: dict[str, asyncio.Queue[_Event | _Lost]] = {}
        self._status: dict[str, asyncio.Future[StatusReply]] = {}  # by the tag its request carried
        self._status_ids = itertools.count()
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: BaseException | None = None  # what ended a task the client needs
        self._closed_why: str | None = None

    @property
    def closed(self) -> bool:
        """True once `close()` was called or the client failed (`closed_reason` says which)."""
        return self._closed_why is not None

    @property
    def closed_reason(self) -> str | None:
        return self._closed_why

    def _closed_error(self) -> ClientClosed:
        """A new error for each caller (one instance raised in many tasks would pile up tracebacks)."""
        err = ClientClosed(f"{self.endpoint}: the client is closed: {self._closed_why}")
        err.__cause__ = self._failure
        return err

    def _check_open(self) -> None:
        if self._closed_why is not None:
            raise self._closed_error()

    def _ensure_reader(self) -> None:
        if self._reader is None:
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read())
            self._watcher = loop.create_task(self._link.run(self._fail_all))
            self._reader.add_done_callback(lambda t: self._task_ended("reply reader", t))
            self._watcher.add_done_callback(lambda t: self._task_ended("link watcher", t))

    def _task_ended(self, what: str, task: asyncio.Task[None]) -> None:
        """Neither task ends while the client is open: if one does, no answer (or no lost link)
        would ever reach a caller again, so the client closes itself and says why."""
        if task.cancelled():
            return
        err = task.exception()  # (retrieved either way: no "never retrieved" warning)
        if self._closed_why is not None:
            return
        self._failure = err
        cause = "it returned" if err is None else f"{type(err).__name__}: {str(err)[:_MAX_CAUSE]}"
        self._closed_why = f"its {what} failed ({cause})"
        log.error("%s: client closed: its %s failed", self.endpoint, what, exc_info=err)
        self._fail_waiters(self._closed_error)

    def _fail_all(self, error: Exception) -> None:
        """The link broke: every waiting caller gets `error` (no answer can come any more)."""
        self._fail_waiters(lambda: error)

    def _fail_waiters(self, error: Callable[[], Exception]) -> None:
        for q in self._queues.values():
            if q.full():
                q.get_nowait()
            q.put_nowait(_Lost(error()))
        self._queues.clear()
        for fut in self._status.values():
            if not fut.done():
                fut.set_exception(error())
        self._status.clear()

    async def _read(self) -> None:
        """Route replies to their callers. Anything but a corrupt message ends this task, and
        with it the client (`_task_ended`): never a silent reader that answers no one."""
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                msg = decode(frames, self.limits, arrays=self._arrays)
            except PayloadError:
                continue  # a corrupt reply cannot be routed; its request times out or gets its error
            if isinstance(msg, StatusReply):
                fut = self._status.pop(msg.request_id or "", None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, StageOutputChunk | Finished | ErrorEvent) and msg.request_id is not None:
                # (an error without a request id refused a message that could not start one)
                self._deliver(msg.request_id, msg)

    def _deliver(self, rid: str, msg: _Event) -> None:
        q = self._queues.get(rid)
        if q is None:
            return
        if q.qsize() < STREAM_QUEUE:
            q.put_nowait(msg)
            return
        # The caller stopped reading: end the request here (the last slot is kept for this).
        del self._queues[rid]
        text = f"the caller read none of the last {STREAM_QUEUE} events of this stream"
        q.put_nowait(ErrorEvent(request_id=rid, stage_id=None, code="slow_consumer", message=text))
        asyncio.get_running_loop().create_task(self._send(Abort(request_id=rid, reason="slow_consumer")))

    async def _send(self, msg: object) -> None:
        await self._sock.send_multipart(encode(msg, self.limits), copy=False)

    async def stream(
        self,
        prompt: str | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
        prompt_embeds: torch.Tensor | np.ndarray | None = None,
        audios: Sequence[AudioLike] = (),
        images: Sequence[ImageLike] = (),
        speaker: str | None = None,
        params: Mapping[str, Any] | None = None,
        sampling: dict[int, SamplingParamsMsg | dict[str, Any]] | None = None,
        deadline_s: float | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
        final_stages: Sequence[int] = (),
        hidden_states: bool = False,
        forced_reply: str | None = None,
        chat_formatted: bool = False,
        _stream: bool = True,
    ) -> AsyncIterator[StageOutputChunk | Finished]:
        """Yield final-stage chunks as they arrive, then the `Finished` event; raise `RequestError` on error.

        `audios` (WAV files or (samples, sample_rate)) and `images` (image files or uint8
        [H, W, 3]) go with a text `prompt` to an entry stage that takes media; `speaker` picks
        the voice of stages that speak; `params` are model parameters that every stage of the
        request gets (an image's `height`, `width`, `num_inference_steps`, `seed`, ...: names
        and values as the model family takes them, e.g. omni_mp.models.qwen_image.params.ImageParams).

        `timeout_s` bounds each wait for the next event on the client side (abort +
        TimeoutError), for a coordinator that is gone; `deadline_s` is enforced by the
        pipeline itself. `sampling` values may also be dicts of SamplingParamsMsg fields.
        `final_stages`: the outputs wanted (default: every final stage); only those stages
        and the ones upstream of them run the request. `hidden_states`: the chunks of final
        stages that emit hidden states (`hidden_states:` in their config) carry them (`hidden`);
        streaming only, since `generate` returns no per-step rows. `forced_reply`: the entry
        stage's reply to the text `prompt`, given rather than generated (Submit.forced_reply:
        e.g. a talker then voices exactly this text). `chat_formatted`: `prompt` is
        already in the entry stage's chat format (e.g. a conversation rendered with the model's
        chat template, one placeholder per medium, in the order of `audios` and `images`).
        Bad arguments raise `InvalidRequest` (a ValueError, and a RequestError with code
        `invalid_input`) naming them: before anything is sent, or, for what only the pipeline
        knows (a stage id it lacks, a prompt too long), from its answer.
        """
        rid = request_id if isinstance(request_id, str) and request_id else uuid.uuid4().hex
        try:
            check_prompt(prompt, prompt_token_ids, prompt_embeds)
            check_names(request_id, speaker)
            check_forced_reply(forced_reply, prompt)
            check_seconds("deadline_s", deadline_s)
            check_seconds("timeout_s", timeout_s)
            if rid in self._queues:
                raise ValueError(f"`request_id` {rid!r} is already in flight on this client")
            if hidden_states and not _stream:
                raise ValueError("`hidden_states`: hidden rows arrive in streamed chunks; use stream()")
            submit = Submit(
                request_id=rid,
                prompt=prompt,
                prompt_token_ids=None if prompt_token_ids is None else list(prompt_token_ids),
                prompt_embeds=None if prompt_embeds is None else PromptEmbeds(data=prompt_embeds),
                # Media files are read off the event loop: a large one must not hold up the
                # replies of the other requests in flight on this client.
                multi_modal=(await asyncio.to_thread(multi_modal_input, audios, images)) if audios or images else None,
                forced_reply=forced_reply,
                speaker=speaker,
                params=request_params(params),
                sampling=stage_sampling(sampling),
                deadline_s=deadline_s,
                stream=_stream,
                final_stages=list(final_stages),
                hidden_states=bool(hidden_states),
                chat_formatted=bool(chat_formatted),
            )
        except ValueError as err:  # (AudioFileError and PayloadError are ValueErrors too)
            raise InvalidRequest.refused(rid, err) from None
        async with contextlib.aclosing(self._answer(rid, submit, timeout_s)) as events:
            async for ev in events:
                yield ev

    async def _answer(self, rid: str, submit: Submit, timeout_s: float | None) -> AsyncIterator[_Event]:
        """Send `submit` and yield its events up to `Finished`; a request left before its end
        (an error, a consumer that stops) is aborted in the pipeline."""
        self._check_open()
        self._ensure_reader()
        await self._link.ready()
        q: asyncio.Queue[_Event | _Lost] = asyncio.Queue(STREAM_QUEUE + 1)
        self._queues[rid] = q
        finished = False
        try:
            await self._send(submit)
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), timeout_s)
                except TimeoutError:
                    raise TimeoutError(f"{self.endpoint}: request {rid!r}: no answer within {timeout_s:g}s") from None
                if isinstance(ev, _Lost):
                    finished = True
                    raise ev.error
                if isinstance(ev, ErrorEvent):
                    finished = True
                    raise _request_error(ev)
                yield ev
                if isinstance(ev, Finished):
                    finished = True
                    return
        finally:
            if self._queues.get(rid) is q:
                del self._queues[rid]
            if not finished and not self.closed and self._link.connected:  # (else no one can get it)
                await self._send(Abort(request_id=rid, reason="cancelled by the client"))

    async def generate(self, prompt: str | None = None, **kwargs: Any) -> Finished:
        async for ev in self.stream(prompt, _stream=False, **kwargs):
            if isinstance(ev, Finished):
                return ev
        raise AssertionError("stream ended without a Finished event")  # stream() raises or returns Finished

    async def generate_image(self, prompt: str | None = None, **kwargs: Any) -> np.ndarray:
        """The request's image (numpy uint8 [height, width, 3]); `generate`'s arguments."""
        return final_image(await self.generate(prompt, **kwargs))

    async def stream_images(self, prompt: str | None = None, **kwargs: Any) -> AsyncIterator[ImageChunk]:
        """Previews as the stage decodes them (`step` set), then the final image (`step` None)."""
        async for ev in self.stream(prompt, **kwargs):
            if isinstance(ev, Finished):
                yield ImageChunk(final_image(ev), None)
                return
            got = chunk_image(ev)
            if got is not None and got.step is not None:
                yield got

    async def abort(self, request_id: str, reason: str = "aborted by the client") -> None:
        self._check_open()
        await self._send(Abort(request_id=request_id, reason=reason))

    async def status(self, timeout_s: float = 10.0) -> StatusReply:
        """The pipeline's status; TimeoutError naming the endpoint after `timeout_s`."""
        check_seconds("timeout_s", timeout_s)
        self._check_open()
        self._ensure_reader()
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        await self._link.ready(timeout_s)
        tag = f"status-{next(self._status_ids)}"
        fut: asyncio.Future[StatusReply] = loop.create_future()
        self._status[tag] = fut
        try:
            await self._send(StatusRequest(request_id=tag))
            try:
                return await asyncio.wait_for(fut, max(0.0, until - loop.time()))
            except TimeoutError:
                raise TimeoutError(f"{self.endpoint}: no status reply within {timeout_s:g}s") from None
        finally:
            self._status.pop(tag, None)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._closed_why = self._closed_why or "close() was called"
        for rid, q in list(self._queues.items()):  # callers still waiting get an answer
            if q.full():
                q.get_nowait()
            q.put_nowait(ErrorEvent(request_id=rid, stage_id=None, code="client_closed", message="client closed"))
        self._queues.clear()
        for task in (self._reader, self._watcher):
            if task is not None and not task.done():  # (a failed one was handled by _task_ended)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._link.close()
        self._sock.close(linger=0)
        self._ctx.term()

    async def __aenter__(self) -> AsyncOmniClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class OmniClient:
    """Synchronous client; thread-safe (all socket work happens on one private loop thread).
    Arguments, errors and timeouts as `AsyncOmniClient`'s."""

    def __init__(
        self,
        endpoint: str,
        *,
        limits: Limits | None = None,
        keys: CurveIdentity | None = None,
        arrays: ArrayKind | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        check_seconds("connect_timeout_s", connect_timeout_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="omni-client-loop", daemon=True)
        self._thread.start()
        self._async: AsyncOmniClient = self._call(self._make(endpoint, limits, keys, arrays, connect_timeout_s))

    @staticmethod
    async def _make(
        endpoint: str, limits: Limits | None, keys: CurveIdentity | None, arrays: ArrayKind | None, connect_s: float
    ) -> AsyncOmniClient:
        return AsyncOmniClient(endpoint, limits=limits, keys=keys, arrays=arrays, connect_timeout_s=connect_s)

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def generate(self, prompt: str | None = None, **kwargs: Any) -> Finished:
        return self._call(self._async.generate(prompt, **kwargs))

    def stream(self, prompt: str | None = None, **kwargs: Any) -> Iterator[StageOutputChunk | Finished]:
        """Yield chunks as they arrive; closing the iterator early aborts the request.

        Each item is pulled on demand from the async stream, so nothing is buffered here
        beyond the async client's bounded per-request queue."""
        agen = self._async.stream(prompt, **kwargs)
        try:
            while True:
                try:
                    yield self._call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._call(agen.aclose())  # runs the stream's finally: the abort, if unfinished

    def stream_audio(self, prompt: str | None = None, **kwargs: Any) -> Iterator[tuple[torch.Tensor | np.ndarray, int]]:
        """PCM chunks (float32 samples, sample rate) of an audio stage, as they are produced."""
        events = self.stream(prompt, **kwargs)
        try:
            for ev in events:
                got = chunk_audio(ev)
                if got is not None:
                    yield got
        finally:
            events.close()  # early exit: aborts the request

    def generate_image(self, prompt: str | None = None, **kwargs: Any) -> np.ndarray:
        """The request's image (numpy uint8 [height, width, 3]); `generate`'s arguments."""
        return final_image(self.generate(prompt, **kwargs))

    def stream_images(self, prompt: str | None = None, **kwargs: Any) -> Iterator[ImageChunk]:
        """Previews as the stage decodes them (`step` set), then the final image (`step` None);
        closing the iterator early aborts the request."""
        events = self.stream(prompt, **kwargs)
        try:
            for ev in events:
                if isinstance(ev, Finished):
                    yield ImageChunk(final_image(ev), None)
                    return
                got = chunk_image(ev)
                if got is not None and got.step is not None:
                    yield got
        finally:
            events.close()  # early exit: aborts the request

    def abort(self, request_id: str, reason: str = "aborted by the client") -> None:
        self._call(self._async.abort(request_id, reason))

    def status(self, timeout_s: float = 10.0) -> StatusReply:
        return self._call(self._async.status(timeout_s))

    @property
    def closed(self) -> bool:
        """True once closed, or once the client failed (`closed_reason` says which)."""
        return self._loop.is_closed() or self._async.closed

    @property
    def closed_reason(self) -> str | None:
        return self._async.closed_reason

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> OmniClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

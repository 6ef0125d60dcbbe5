"""Transcripts of a realtime session's user audio turns (`audio.input.transcription`, beta
`input_audio_transcription`): each committed audio item is transcribed by the thinker the way
`POST /v1/audio/transcriptions` does it (omni_mp.http.transcriptions: the family's prompt,
`run_transcription`, temperature 0, the endpoint's default), as a request of its own that runs
beside the answer (the answer does not wait for it). Its text comes as
`conversation.item.input_audio_transcription.delta` events, then `.completed` (with usage) or
`.failed`, and stays in the item (content `input_audio`'s `transcript`).

Bounded: one request per audio item still in the conversation (an item dropped or deleted has
its transcription cancelled, its request aborted in every stage, when the next one starts);
all are cancelled when the session closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from contextlib import aclosing
from typing import Any

from omni_mp.client.omni_client import ClientClosed
from omni_mp.http.errors import ApiError
from omni_mp.http.pipeline import Sampling
from omni_mp.http.realtime.events import ErrorBody, Transcription
from omni_mp.http.realtime.history import History, HistoryItem
from omni_mp.http.realtime.response import Send, api_error_body
from omni_mp.http.realtime.vad import RATE
from omni_mp.http.transcriptions import TranscriptionJob, run_transcription, transcriber

log = logging.getLogger("omni_mp.http.realtime")
PREFIX = "conversation.item.input_audio_transcription"


class InputTranscripts:
    def __init__(self, srv: Any, send: Send) -> None:
        self.srv, self.send = srv, send
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, item: HistoryItem, history: History, settings: Transcription) -> None:
        """Transcribe `item`'s audio beside whatever else runs."""
        for gone in [k for k in self.tasks if history.find(k) is None]:
            self.tasks.pop(gone).cancel()
        prompt = transcriber(self.srv.view).transcription(settings.language, settings.prompt)
        sampling = self.srv.view.sampling(Sampling(temperature=0.0), audio=False)
        assert item.audio is not None
        job = TranscriptionJob(prompt, item.audio, RATE, True, "json", sampling)
        item.transcript = ""
        self.tasks[item.id] = asyncio.create_task(self._run(item, job))

    async def _run(self, item: HistoryItem, job: TranscriptionJob) -> None:
        srv, at = self.srv, {"item_id": item.id, "content_index": 0}
        events = run_transcription(srv.omni, srv.view, srv.tokenizer, job, f"rt-asr-{uuid.uuid4().hex}")
        try:
            async with aclosing(events):
                async for ev in events:
                    if isinstance(ev, str):
                        item.transcript = (item.transcript or "") + ev
                        await self.send(f"{PREFIX}.delta", **at, delta=ev)
                    else:
                        item.transcript = ev.text
                        await self.send(f"{PREFIX}.completed", **at, transcript=ev.text, usage=ev.usage)
        except (ApiError, ClientClosed) as err:
            gone = ErrorBody("server_error", "client_closed", str(err))
            body = api_error_body(err) if isinstance(err, ApiError) else gone
            with contextlib.suppress(RuntimeError, OSError):  # (the client may be gone too)
                await self.send(f"{PREFIX}.failed", **at, error=body)
        except (RuntimeError, OSError) as err:  # the client went away mid-send
            log.info("realtime transcription of %s not delivered (%s)", item.id, err)
        finally:
            if self.tasks.get(item.id) is asyncio.current_task():
                del self.tasks[item.id]

    async def close(self) -> None:
        tasks, self.tasks = list(self.tasks.values()), {}
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, RuntimeError, OSError):
                await t

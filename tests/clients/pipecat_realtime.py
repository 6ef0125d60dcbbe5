"""pipecat's OpenAI Realtime service (`OpenAIRealtimeLLMService`) holding a spoken turn with an
omni_mp server, as a pipecat voice bot does, with no other service: the user's audio goes in
as InputAudioRawFrames (at the API's 24 kHz: pipecat sends them as they are), the server's VAD ends
the turn and answers; out come the answer's audio (TTSAudioRawFrames), its text, and the user
turn's transcript (a TranscriptionFrame, pushed upstream, from
`conversation.item.input_audio_transcription.completed`). Writes them and any error frames.

Run by tests/test_http_realtime.py in the clients' own virtualenv (scripts/setup.sh), as
`python pipecat_realtime.py WS_URL API_KEY VOICE IN.pcm OUT.json` (IN.pcm: int16 24 kHz mono;
OUT.json.pcm: the int16 24 kHz samples the service pushed)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

TURN_TIMEOUT_S = 600
RATE = 24_000


class Collect(FrameProcessor):
    """Frames either way: before the service it sees what goes upstream, after it what comes down."""

    def __init__(self) -> None:
        super().__init__()
        self.pcm = bytearray()
        self.rates: set[int] = set()
        self.text = ""
        self.transcripts: list[str] = []
        self.errors: list[str] = []
        self.answered = asyncio.Event()
        self.transcribed = asyncio.Event()

    async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.pcm += frame.audio
            self.rates.add(frame.sample_rate)
        elif isinstance(frame, TTSTextFrame):
            self.text += frame.text
        elif isinstance(frame, TranscriptionFrame):
            self.transcripts.append(frame.text)
            self.transcribed.set()
        elif isinstance(frame, ErrorFrame):
            self.errors.append(str(frame.error))
            self.answered.set()
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.answered.set()
        await self.push_frame(frame, direction)


async def main(url: str, api_key: str, voice: str, pcm_in: str, out: str) -> None:
    audio = open(pcm_in, "rb").read()
    vad = events.TurnDetection(prefix_padding_ms=200, silence_duration_ms=400)
    heard = events.AudioInput(transcription=events.InputAudioTranscription(), turn_detection=vad)
    audio_cfg = events.AudioConfiguration(input=heard, output=events.AudioOutput(voice=voice))
    props = events.SessionProperties(instructions="Answer briefly.", audio=audio_cfg)
    settings = OpenAIRealtimeLLMService.Settings(model="tiny", session_properties=props)
    llm = OpenAIRealtimeLLMService(api_key=api_key, base_url=url, settings=settings)
    up, down = Collect(), Collect()
    task = PipelineWorker(Pipeline([up, llm, down]), params=PipelineParams(audio_in_sample_rate=RATE))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    running = asyncio.create_task(runner.run())
    while not llm._api_session_ready:  # (session.updated: our settings hold from here)
        await asyncio.sleep(0.05)
    step = RATE * 2 // 10  # 100 ms
    frames = [InputAudioRawFrame(audio[i : i + step], RATE, 1) for i in range(0, len(audio), step)]
    await task.queue_frames(frames)
    await asyncio.wait_for(down.answered.wait(), TURN_TIMEOUT_S)
    await asyncio.wait_for(up.transcribed.wait(), TURN_TIMEOUT_S)
    await task.queue_frames([EndFrame()])
    await asyncio.wait_for(running, TURN_TIMEOUT_S)
    info = {"text": down.text, "rates": sorted(down.rates), "transcripts": up.transcripts,
            "errors": up.errors + down.errors}  # fmt: skip
    with open(out, "w") as fh:
        json.dump(info, fh)
    with open(f"{out}.pcm", "wb") as fh:
        fh.write(bytes(down.pcm))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))

"""pipecat's OpenAI TTS service (OpenAITTSService: pcm at 24 kHz, OpenAI voice names only) in a
pipecat pipeline against an omni_mp server: speaks one text and writes the PCM of the
TTSAudioRawFrames that reach the end of the pipeline, their rates and channel counts, and
any error frames.

Run by tests/test_http_speech.py in the clients' own virtualenv (scripts/setup.sh), as
`python pipecat_tts.py BASE_URL API_KEY TEXT VOICE OUT.json` (OUT.json.pcm: the int16 samples)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from pipecat.frames.frames import EndFrame, ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.workers.runner import WorkerRunner


class Collect(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.pcm = bytearray()
        self.rates: set[int] = set()
        self.channels: set[int] = set()
        self.errors: list[str] = []

    async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.pcm += frame.audio
            self.rates.add(frame.sample_rate)
            self.channels.add(frame.num_channels)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(str(frame.error))
        await self.push_frame(frame, direction)


async def main(base_url: str, api_key: str, text: str, voice: str, out: str) -> None:
    tts = OpenAITTSService(api_key=api_key, base_url=base_url, settings=OpenAITTSService.Settings(voice=voice))
    sink = Collect()
    task = PipelineWorker(Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=24_000))
    await task.queue_frames([TTSSpeakFrame(text), EndFrame()])
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    await runner.run()
    with open(out + ".pcm", "wb") as fh:
        fh.write(sink.pcm)
    info = {"rates": sorted(sink.rates), "channels": sorted(sink.channels), "errors": sink.errors}
    with open(out, "w") as fh:
        json.dump(info, fh)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))

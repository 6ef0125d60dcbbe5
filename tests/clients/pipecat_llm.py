"""pipecat's OpenAI LLM service (OpenAILLMService, streamed chat completions) holding a
conversation with an omni_mp server the way a pipecat voice bot does: an LLMContext with a
system prompt, its context aggregators around the service, a first turn run from the
context (LLMRunFrame), then a second user message appended (LLMMessagesAppendFrame) once the
first answer is in the context. Writes each answer's text (from the LLMTextFrames), the
context's messages at the end and any error frames.

Run by tests/test_http_server.py in the clients' own virtualenv (scripts/setup.sh), as
`python pipecat_llm.py BASE_URL API_KEY SYSTEM FIRST SECOND OUT.json`."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMRunFrame,
    LLMTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.workers.runner import WorkerRunner

TURN_TIMEOUT_S = 600


class Collect(FrameProcessor):
    """Each answer's text, between its LLMFullResponseStart and End frames."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[str] = []
        self.errors: list[str] = []
        self.done = asyncio.Queue[None]()

    async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self.answers.append("")
        elif isinstance(frame, LLMTextFrame):
            self.answers[-1] += frame.text
        elif isinstance(frame, ErrorFrame):
            self.errors.append(str(frame.error))
            self.done.put_nowait(None)
        await self.push_frame(frame, direction)
        if isinstance(frame, LLMFullResponseEndFrame):
            await asyncio.sleep(0.2)  # the assistant aggregator (after us) writes the answer
            self.done.put_nowait(None)


async def main(base_url: str, api_key: str, system: str, first: str, second: str, out: str) -> None:
    llm = OpenAILLMService(api_key=api_key, base_url=base_url, settings=OpenAILLMService.Settings(model="omni"))
    context = LLMContext(messages=[{"role": "system", "content": system}, {"role": "user", "content": first}])
    pair = LLMContextAggregatorPair(context)
    sink = Collect()
    task = PipelineWorker(Pipeline([pair.user(), llm, sink, pair.assistant()]), params=PipelineParams())
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    running = asyncio.create_task(runner.run())
    await task.queue_frames([LLMRunFrame()])
    await asyncio.wait_for(sink.done.get(), TURN_TIMEOUT_S)
    await task.queue_frames([LLMMessagesAppendFrame(messages=[{"role": "user", "content": second}], run_llm=True)])
    await asyncio.wait_for(sink.done.get(), TURN_TIMEOUT_S)
    await task.queue_frames([EndFrame()])
    await asyncio.wait_for(running, TURN_TIMEOUT_S)
    info = {"answers": sink.answers, "messages": context.get_messages(), "errors": sink.errors}
    with open(out, "w") as fh:
        json.dump(info, fh, default=str)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))

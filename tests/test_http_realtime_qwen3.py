# ruff: noqa: E501
"""`/v1/realtime` on the tiny Qwen3-Omni pipeline (CPU), driven by the `openai` SDK's realtime
client: a spoken turn equals the chat endpoint's answer on the same audio, and a tool call
(vLLM's hermes parser through omni_mp.http.vllm_hooks_tools) comes as
`response.function_call_arguments.*` with a call_id of at most 32 characters, is not spoken,
and the answer to its `function_call_output` is."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import openai
import pytest
import soxr

from tests.launcher import ServedPipeline
from tests.shared_servers import KEY
from tests.test_http_realtime import RATE, SPEECH, _audio_of, _chunks, _pcm16, _pcm16_float, _say, _until, _wav_b64

VOICE = "ethan"
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                       "required": ["city"], "additionalProperties": False}}  # fmt: skip
SESSION = {"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 160,
           "audio": {"input": {"turn_detection": None}, "output": {"voice": VOICE}}}  # fmt: skip


@pytest.fixture(scope="module")
def url(shared_tiny_qwen3_omni: tuple[ServedPipeline, str]) -> str:
    return shared_tiny_qwen3_omni[1]  # tests/shared_servers.py


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=900)


def test_a_spoken_turn_equals_chat_completions(url: str) -> None:
    async def turn() -> list[Any]:
        seen: list[Any] = []
        async with _client(url).realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session={**SESSION, "max_output_tokens": 12})  # type: ignore[arg-type]
            await _until(conn, "session.updated", seen)
            for chunk in _chunks(_pcm16(SPEECH)):
                await conn.input_audio_buffer.append(audio=chunk)
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            await _until(conn, "response.done", seen, timeout_s=900)
        return seen

    seen = asyncio.run(turn())
    transcript = next(e.transcript for e in seen if e.type == "response.output_audio_transcript.done")
    pcm = np.frombuffer(_audio_of(seen), dtype="<i2")
    at_16k = soxr.resample(_pcm16_float(SPEECH), RATE, 16_000).astype(np.float32)
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=900)
    r = chat.chat.completions.create(
        model="tiny", modalities=["text", "audio"], audio={"voice": VOICE, "format": "pcm16"}, max_completion_tokens=12,
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": _wav_b64(at_16k), "format": "wav"}}]}],
    )  # fmt: skip
    msg = r.choices[0].message
    assert msg.audio is not None and transcript == msg.audio.transcript
    chat_pcm = np.frombuffer(base64.b64decode(msg.audio.data), dtype="<i2")
    assert len(pcm) == len(chat_pcm) > 0 and np.abs(chat_pcm.astype(int) - pcm.astype(int)).max() <= 1


def test_a_tool_call_is_not_spoken_and_its_output_is_answered_aloud(url: str) -> None:
    async def run() -> tuple[list[Any], list[Any]]:
        first: list[Any] = []
        second: list[Any] = []
        async with _client(url).realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", first)
            await conn.session.update(session={**SESSION, "tools": [TOOL], "tool_choice": "required"})  # type: ignore[arg-type]
            await _until(conn, "session.updated", first)
            await _say(conn, "What is the weather in Paris?")
            await conn.response.create()
            await _until(conn, "response.done", first, timeout_s=900)
            done = next(e for e in first if e.type == "response.function_call_arguments.done")
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": done.call_id, "output": "Sunny, 21 C"}
            )
            await conn.response.create(response={"tool_choice": "none"})
            await _until(conn, "response.done", second, timeout_s=900)
        return first, second

    first, second = asyncio.run(run())
    done = next(e for e in first if e.type == "response.function_call_arguments.done")
    assert done.name == "get_weather" and json.loads(done.arguments)["city"] in ("Paris", "Oslo")
    assert len(done.call_id) <= 32
    deltas = "".join(e.delta for e in first if e.type == "response.function_call_arguments.delta")
    assert json.loads(deltas) == json.loads(done.arguments)
    assert not _audio_of(first)  # the call is not spoken
    end = next(e for e in first if e.type == "response.done")
    assert [o.type for o in end.response.output] == ["function_call"] and end.response.output[0].call_id == done.call_id
    assert len(_audio_of(second)) > 1000  # the answer to the tool's output is
    assert not any(e.type.startswith("response.function_call") for e in second)

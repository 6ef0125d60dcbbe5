# ruff: noqa: E501  (the conversations and bad inputs read best one per line)
"""Whole conversations over the HTTP chat endpoint (omni_mp.http.conversation, audio_ids, tools)
on the tiny Qwen3-Omni pipeline: one launcher with `--http`, driven by the official `openai`
SDK, against transformers on the same checkpoint (fp32, greedy): the processor's
`apply_chat_template` + processor give the prompt ids the thinker saw, and
`Qwen3OmniMoeForConditionalGeneration.generate` on that conversation gives the same text,
codes (every frame's 16) and waveform. Conversations of 1, 2 and 4 user turns with audio and
image parts in earlier turns; the 2-turn one continues the 1-turn answer through its audio id.

Tolerance (waveform, HTTP's 16-bit WAV against transformers' float waveform), measured here on
the 1-turn conversation: max abs error 3.7e-5 (about one PCM step: 16-bit rounding
dominates; the float pipeline is within 2.5e-5 of transformers, tests/test_qwen3_omni_pipeline).
Bound: WAV_ATOL = one PCM step + 1e-4."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile
import torch

from omni_mp.client.omni_client import OmniClient
from omni_mp.http.audio_ids import MemoryAudioStore
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import StageOutputChunk
from tests.hf_oracle import assert_same_tokens
from tests.hf_oracle_qwen3_omni import OmniResult, conversation_inputs, omni_generate
from tests.launcher import ServedPipeline, settled_client
from tests.shared_servers import KEY
from tests.synthetic_media import pattern, tone
from tests.test_qwen3_omni_pipeline import Run

CONFIG = CONFIG_DIR / "tiny_qwen3_omni.yaml"
TOKENS = 12  # thinker tokens per answer (max_completion_tokens)
PCM_LSB = 1 / 32768
AUTH = {"Authorization": f"Bearer {KEY}"}
WAV_ATOL = PCM_LSB + 1e-4
MIN_MARGIN = 1e-5
VOICE = "ethan"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


# ---- forced calls and parallel_tool_calls (vLLM's parser and xgrammar, no pipeline) -------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>'


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("tiny-qwen3-omni"))


def _accepts(tag: str, text: str) -> bool:
    """Whether xgrammar (vLLM's structured-output backend), compiling `tag` for the tiny
    checkpoint's tokenizer, accepts `text` as (a prefix of) the answer."""
    import xgrammar

    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(_tokenizer()))
    return bool(xgrammar.GrammarMatcher(compiler.compile_structural_tag(tag)).accept_string(text))


def test_a_forced_call_allows_no_run_of_whitespace_and_one_call_without_parallel_calls() -> None:
    from omni_mp.http.vllm_hooks_tools import structural_tag

    required = structural_tag(TOOLS, "required")
    one = structural_tag(TOOLS, "required", parallel=False)
    assert required is not None and one is not None
    paris = '{"city": "Paris"}'
    for tag in (required, one):
        assert _accepts(tag, CALL % paris) and _accepts(tag, CALL % '{"city":"Paris"}')
        assert not _accepts(tag, CALL % '{\r\r"city": "Paris"}')  # what padded the tiny model's call
        assert not _accepts(tag, CALL % '{"city":  "Paris"}')
    assert _accepts(required, CALL % paris + CALL % '{"city": "Oslo"}')  # parallel calls allowed
    assert not _accepts(one, CALL % paris + "<tool_call>")  # the answer ends after one
    named = structural_tag(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert named is not None and not _accepts(named, CALL % paris + "<tool_call>")  # (vLLM's own rule)


def test_parallel_tool_calls_false_keeps_the_first_call_streamed_and_whole() -> None:
    from omni_mp.http.vllm_hooks_tools import ToolCallReader

    tok = _tokenizer()
    text = "Let me check. " + CALL % '{"city": "Paris"}' + "\n" + CALL % '{"city": "Oslo"}'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for parallel, cities in ((True, ["Paris", "Oslo"]), (False, ["Paris"])):
        reader = ToolCallReader(tok, TOOLS, "auto", parallel=parallel)
        content, calls = reader.final(text)
        assert content == "Let me check. " and [json.loads(c.function.arguments)["city"] for c in calls] == cities
        streamed = ToolCallReader(tok, TOOLS, "auto", parallel=parallel)
        args: dict[int, str] = {}
        for k, t in enumerate(ids):  # one token at a time, as the thinker streams them
            piece = tok.decode(ids[: k + 1]).removeprefix(tok.decode(ids[:k]))
            for d in streamed.delta(piece, [t])[1]:
                args[d.index] = args.get(d.index, "") + ((d.function and d.function.arguments) or "")
        assert [json.loads(args[i])["city"] for i in sorted(args)] == cities


# ---- the served pipeline -----------------------------------------------------------------------


class Served:
    def __init__(self, pipeline: ServedPipeline, url: str) -> None:
        self.pipeline, self.url = pipeline, url
        self.openai = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=900)


@pytest.fixture(scope="module")
def served(shared_tiny_qwen3_omni: tuple[ServedPipeline, str]) -> Served:
    return Served(*shared_tiny_qwen3_omni)  # tests/shared_servers.py


def _wav_b64(samples: np.ndarray) -> str:
    buf = io.BytesIO()
    soundfile.write(buf, samples, 16_000, format="WAV", subtype="FLOAT")
    return base64.b64encode(buf.getvalue()).decode()


def _png_url(pixels: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


AUDIO, IMAGE = tone(1.0), pattern(64)  # whole hops of 160 samples (see qwen3_omni/prompt.py)
TURN1 = [
    {"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": _wav_b64(AUDIO), "format": "wav"}},
        {"type": "text", "text": "What do you hear?"},
    ]},
]  # fmt: skip
LATER = [
    {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _png_url(IMAGE)}}, {"type": "text", "text": "And this?"},
    ]},
    {"role": "assistant", "content": "A picture of stripes."},
    {"role": "user", "content": "Which colours?"},
    {"role": "assistant", "content": "Red and green."},
    {"role": "user", "content": "Thanks. Bye."},
]  # fmt: skip


def _template_messages(messages: list[dict[str, Any]], transcripts: dict[str, str]) -> list[dict[str, Any]]:
    """The same conversation as transformers' chat template takes it (media as typed parts,
    an earlier answer's audio id as its transcript)."""
    out = []
    for m in messages:
        if m["role"] == "assistant" and "audio" in m:
            out.append({"role": "assistant", "content": transcripts[m["audio"]["id"]]})
        elif isinstance(m.get("content"), list):
            kinds = {"input_audio": "audio", "image_url": "image"}
            parts = [
                {"type": "text", "text": p["text"]} if p["type"] == "text" else {"type": kinds[p["type"]]}
                for p in m["content"]
            ]
            out.append({"role": m["role"], "content": parts})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def _media(messages: list[dict[str, Any]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    audios = [
        AUDIO
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p["type"] == "input_audio"
    ]
    images = [
        IMAGE for m in messages if isinstance(m.get("content"), list) for p in m["content"] if p["type"] == "image_url"
    ]
    return audios, images


def _spoken(served: Served, messages: list[dict[str, Any]]) -> Any:
    return served.openai.chat.completions.create(
        model="m", messages=messages, modalities=["text", "audio"], audio={"voice": VOICE, "format": "wav"},
        max_completion_tokens=TOKENS,
    )  # fmt: skip


def _check_against_transformers(served: Served, messages: list[dict[str, Any]], transcripts: dict[str, str]) -> str:  # noqa: E501
    """One spoken answer over HTTP and the same conversation through the ZMQ client (the codes),
    against transformers; returns the answer's audio id (its transcript recorded)."""
    return _spoken_against_transformers(served, messages, transcripts)[0].choices[0].message.audio.id


def _spoken_against_transformers(
    served: Served, messages: list[dict[str, Any]], transcripts: dict[str, str]
) -> tuple[Any, list[int]]:
    """`_check_against_transformers`, returning the HTTP answer and the thinker's prompt ids."""
    model_dir = resolve_model("tiny-qwen3-omni")
    audios, images = _media(messages)
    hf_messages = _template_messages(messages, transcripts)
    inputs = conversation_inputs(model_dir, hf_messages, audios, images)
    want: OmniResult = omni_generate(model_dir, "", speaker=VOICE, thinker_max_new_tokens=TOKENS, inputs=inputs)
    got = _spoken(served, messages)
    msg = got.choices[0].message
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = want.thinker_ids[: want.thinker_ids.index(eos)] if eos in want.thinker_ids else want.thinker_ids
    assert msg.content == tok.decode(ids) == msg.audio.transcript
    assert min(want.thinker_margins) > MIN_MARGIN and min(want.code_margins) > MIN_MARGIN
    wav, rate = soundfile.read(io.BytesIO(base64.b64decode(msg.audio.data)), dtype="float32")
    assert rate == 24_000 and wav.shape == tuple(want.wav.shape), (wav.shape, want.wav.shape)
    err = float(np.abs(wav - want.wav.numpy()).max())
    print(f"waveform max abs error {err:.2e} over {wav.size} samples")  # the tolerance's measurement
    assert err <= WAV_ATOL and float(np.abs(want.wav).max()) > 100 * WAV_ATOL
    # The same conversation rendered by the server's history builder, through the ZMQ client:
    # the thinker's prompt ids (media expanded) and every frame's codes.
    from omni_mp.http.conversation import render
    from omni_mp.models.qwen3_omni.prompt import CHAT

    prompt = render(_conv(messages, transcripts), CHAT, tok.apply_chat_template, speak=True)
    with settled_client(served.pipeline.endpoint) as zmq:
        events = list(_zmq_stream(zmq, prompt))
    run = Run(events)
    thinker_prompt = next(
        ev.prompt_token_ids for ev in events
        if isinstance(ev, StageOutputChunk) and ev.stage_id == 0 and ev.prompt_token_ids is not None
    )  # fmt: skip
    assert list(thinker_prompt) == inputs["input_ids"][0].tolist()
    assert_same_tokens(run.tokens[0], want.thinker_ids, want.thinker_margins, "thinker")
    frames = run.frames()
    assert frames.shape == want.codes.shape and torch.equal(frames, want.codes)
    transcripts[msg.audio.id] = msg.audio.transcript
    return got, list(thinker_prompt)


def _conv(messages: list[dict[str, Any]], transcripts: dict[str, str]) -> Any:
    import msgspec

    from omni_mp.config.schema import MediaLimits
    from omni_mp.http.conversation import from_messages
    from omni_mp.http.media import MediaSizes
    from omni_mp.http.schemas import ChatMessage

    store = MemoryAudioStore()
    parsed = [msgspec.convert(_template_ids(m, transcripts), ChatMessage) for m in messages]
    return from_messages(parsed, MediaSizes(max_media_bytes=1 << 24), MediaLimits(max_audio_s=60.0), store)


def _template_ids(m: dict[str, Any], transcripts: dict[str, str]) -> dict[str, Any]:
    if m["role"] == "assistant" and "audio" in m:
        return {"role": "assistant", "content": transcripts[m["audio"]["id"]]}
    return m


def _zmq_stream(zmq: OmniClient, prompt: Any) -> Iterator[Any]:
    import msgspec

    from omni_mp.config.validate import load_config

    text = msgspec.structs.replace(load_config(CONFIG).stage(0).sampling, max_tokens=TOKENS)  # what HTTP sends
    return zmq.stream(
        prompt.text, audios=[(torch.from_numpy(a), r) for a, r in prompt.audios],
        images=[torch.from_numpy(i) for i in prompt.images], speaker=VOICE, chat_formatted=True,
        sampling={0: text}, hidden_states=True, deadline_s=900,
    )  # fmt: skip


def test_conversations_of_1_2_and_4_turns_equal_transformers(served: Served) -> None:
    """Each answer's text, codes and waveform equal transformers' generate() on the same
    conversation; the 2-turn one sends the first answer back by its audio id."""
    transcripts: dict[str, str] = {}
    first = _check_against_transformers(served, TURN1, transcripts)
    # (No audio and image in one conversation: transformers' Qwen3-Omni talker fails on that
    # mix in its rope index, 'Qwen3OmniMoeTalkerConfig' has no 'audio_config', 5.17.0.)
    two = [LATER[0], {"role": "assistant", "audio": {"id": first}}, LATER[2]]
    _check_against_transformers(served, two, transcripts)
    four = [{"role": "system", "content": "Answer briefly."}, *two, LATER[3], LATER[2], LATER[1], LATER[4]]
    _check_against_transformers(served, four, transcripts)


def test_spoken_answers_read_the_thinkers_prefix_cache_up_to_their_first_media_row(served: Served) -> None:
    """The talker reads the thinker's rows only at the prompt's media placeholders (its text rows
    come from the embedding table by id): a spoken turn reads the thinker's prefix cache, up to
    its first media position when it has media, and speaks exactly what transformers says."""
    system = {"role": "system", "content": "You are a helpful assistant who answers briefly. " * 6}
    transcripts: dict[str, str] = {}
    # Text turns: the second reads the cached system prompt and first turn, past any row it needs.
    first = _spoken(served, [system, LATER[2]]).choices[0].message
    transcripts[first.audio.id] = first.audio.transcript
    two = [system, LATER[2], {"role": "assistant", "audio": {"id": first.audio.id}}, LATER[4]]
    got, ids = _spoken_against_transformers(served, two, transcripts)
    cached = got.usage.prompt_tokens_details.cached_tokens
    assert cached >= 48 and cached % 16 == 0 and cached < len(ids), (cached, len(ids))
    # An audio turn after the same system prompt: the cache is read only below the audio.
    _spoken(served, [system, *TURN1])
    got, ids = _spoken_against_transformers(served, [system, *TURN1], transcripts)
    from transformers import AutoTokenizer

    audio_pad = AutoTokenizer.from_pretrained(resolve_model("tiny-qwen3-omni")).convert_tokens_to_ids("<|audio_pad|>")
    cached = got.usage.prompt_tokens_details.cached_tokens
    assert 16 <= cached <= ids.index(audio_pad) and cached % 16 == 0, (cached, ids.index(audio_pad))


def test_a_forced_tool_call_is_parsed_never_spoken_and_its_result_answered(served: Served) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    got = served.openai.chat.completions.create(
        model="m", messages=ask, tools=TOOLS, tool_choice="required", modalities=["text", "audio"],
        audio={"voice": VOICE, "format": "wav"}, max_completion_tokens=160,
    )  # fmt: skip
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert choice.message.audio is None  # the talker spoke nothing: the answer is the call
    # Streamed: the call arrives in tool_calls deltas (name first, then its arguments).
    stream = served.openai.chat.completions.create(
        model="m", messages=ask, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_completion_tokens=160, stream=True,
    )  # fmt: skip
    name, args, reason = None, "", None
    for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or []:
            name = d.function.name or name
            args += d.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    assert name == "get_weather" and json.loads(args)["city"] in ("Paris", "Oslo") and reason == "tool_calls"
    # The tool's result goes back; the answer to it is spoken.
    follow = [
        *ask,
        {
            "role": "assistant",
            "tool_calls": [{"id": call.id, "type": "function", "function": call.function.model_dump()}],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    answer = _spoken(served, follow).choices[0].message
    assert answer.audio is not None and answer.content and not answer.tool_calls
    assert len(base64.b64decode(answer.audio.data)) > 1000


BAD: list[tuple[str, Any, str]] = [
    ("empty", [], "messages"),
    ("malformed", [{"content": "no role"}], "messages[0]"),
    ("assistant first", [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}], "messages[0].role"),
    ("system late", [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "messages[1].role"),
    ("ends on assistant", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "messages[1].role"),
    ("tool without call", [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c", "content": "y"}],
     "messages[1].tool_call_id"),
    ("unknown audio id", [{"role": "user", "content": "x"}, {"role": "assistant", "audio": {"id": "audio_{tag}_00"}},
                          {"role": "user", "content": "y"}], "messages[1].audio.id"),
    ("foreign audio id", [{"role": "user", "content": "x"}, {"role": "assistant", "audio": {"id": "audio_0badc0ffee00_00"}},
                          {"role": "user", "content": "y"}], "messages[1].audio.id"),
    ("too many media", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "{png}"}}]}] * 5,
     "messages[4].content"),
    ("too long", [{"role": "user", "content": "word " * 3000}], "messages"),
    # Short text, but three 1024x1024 images (~960 tokens each) in the history: the thinker's
    # processor finds the conversation past its context of 2048.
    ("media past the context", [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "{big}"}}] * 2 + [{"type": "text", "text": "Look"}]},
        {"role": "assistant", "content": "Two pictures."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "{big}"}}, {"type": "text", "text": "And this?"}]},
    ], "messages"),
    ("tool_choice without tools", {"tool_choice": "required"}, "tool_choice"),
]  # fmt: skip


def test_bad_conversations_are_400_naming_the_field_and_nothing_else_is_affected(served: Served) -> None:
    first = _spoken(served, [{"role": "user", "content": "Hello"}]).choices[0].message.audio.id
    tag = first.split("_")[1]
    png, big = _png_url(pattern(28)), _png_url(pattern(1024))
    for name, body, param in BAD:
        payload: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        if isinstance(body, dict):
            payload.update(body)
        else:
            text = json.dumps(body).replace("{tag}", tag).replace("{png}", png).replace("{big}", big)
            payload["messages"] = json.loads(text)
        r = httpx.post(f"{served.url}/v1/chat/completions", json=payload, headers=AUTH, timeout=300)
        assert r.status_code == 400, (name, r.status_code, r.text[:300])
        error = r.json()["error"]
        assert error["param"] == param, (name, error)
        if name in ("too long", "media past the context"):
            assert error["code"] == "context_length_exceeded" and "2048" in error["message"], (name, error)
        if name == "media past the context":  # counted by the thinker's processor, media expanded
            assert error["message"].startswith("stage 0: context length exceeded: the prompt is "), error
    again = _spoken(served, [{"role": "user", "content": "Hello"}]).choices[0].message
    assert again.audio is not None and again.content  # the pipeline still serves

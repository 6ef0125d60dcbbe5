# ruff: noqa: E501  (event sequences read best one per line)
"""`/v1/realtime` (omni_mp.http.realtime) end to end on the tiny Qwen2.5-Omni pipeline (CPU): one
launcher with `--http` and `--api-key`, driven by the official `openai` SDK's realtime client
(GA) and by a raw `websockets` client where the wire itself is checked (handshake refusals,
beta spellings, malformed frames). Oracles: the chat completions endpoint on the same
conversation (the same audio, the same instructions) gives the same answer; Silero's own
timing (`silero_vad.get_speech_timestamps` on the same audio) bounds the VAD events; the
coordinator's `inflight` says when every stage has freed an aborted request."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import soundfile
import soxr
import websockets

from omni_mp.client.omni_client import OmniClient
from omni_mp.http.realtime.history import History, HistoryItem, played_prefix
from omni_mp.http.realtime.vad import Detector, VadSettings
from omni_mp.stage_configs import CONFIG_DIR
from tests.client_scripts import client_script
from tests.launcher import ServedPipeline, settled_client
from tests.shared_servers import (
    KEY,
    REALTIME_HISTORY_TOKENS,
    REALTIME_IDLE_S,
    REALTIME_MAX_SESSIONS,
    REALTIME_MAX_TURN_S,
)
from tests.synthetic_media import speechlike

# The served pipeline's http.realtime bounds (tests/shared_servers.py).
MAX_SESSIONS = REALTIME_MAX_SESSIONS
IDLE_S = REALTIME_IDLE_S
MAX_TURN_S = REALTIME_MAX_TURN_S
HISTORY_TOKENS = REALTIME_HISTORY_TOKENS
RATE = 24_000
SPEECH = speechlike()  # 2.25 s of voice to Silero, 24 kHz float32
LEAD_S, TAIL_S = 0.5, 1.0  # silence around it in the VAD turns
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # the talk mode's browser


def _pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def _chunks(pcm: bytes, ms: int = 100) -> list[str]:
    step = RATE * 2 * ms // 1000
    return [base64.b64encode(pcm[i : i + step]).decode() for i in range(0, len(pcm), step)]


# ---- no pipeline: the VAD, the history bound, truncation -----------------------------------------


def _silero_segments(audio_16k: np.ndarray, settings: VadSettings) -> list[dict[str, int]]:
    """silero-vad's own offline segmentation of the same audio (the package's reference code)."""
    import torch

    threads = torch.get_num_threads()
    from silero_vad import get_speech_timestamps, load_silero_vad  # its import sets torch's threads to 1

    torch.set_num_threads(threads)  # as they were, for the in-process engines of later tests

    model = load_silero_vad(onnx=True)
    return get_speech_timestamps(torch.from_numpy(audio_16k), model, threshold=settings.threshold,
                                 min_silence_duration_ms=settings.silence_duration_ms, speech_pad_ms=0,
                                 min_speech_duration_ms=0, return_seconds=False)  # fmt: skip


def test_vad_events_are_timed_against_the_audio_sent_and_honour_the_settings() -> None:
    audio = np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), SPEECH, np.zeros(int(TAIL_S * RATE), np.float32)])
    at_16k = soxr.resample(audio, RATE, 16_000).astype(np.float32)
    plain = VadSettings(threshold=0.5, prefix_padding_ms=0, silence_duration_ms=400)
    want = _silero_segments(at_16k, plain)
    assert len(want) == 1
    d = Detector(plain)
    got = [e for k in range(0, len(at_16k), 1600) for e in d.feed(at_16k[k : k + 1600])]  # 100 ms pieces
    assert [e.started for e in got] == [True, False]
    start_ms, end_ms = want[0]["start"] * 1000 // 16_000, want[0]["end"] * 1000 // 16_000
    assert abs(got[0].ms - start_ms) <= 32  # one frame
    assert got[1].ms - end_ms == pytest.approx(400, abs=64)  # the silence waited for, within two frames
    assert abs(got[0].ms - LEAD_S * 1000) <= 64  # and against the truth of the synthetic audio
    padded = Detector(VadSettings(0.5, prefix_padding_ms=300, silence_duration_ms=800))
    ev = padded.feed(at_16k)
    assert ev[0].ms == got[0].ms - 300 and ev[1].ms == pytest.approx(got[1].ms + 400, abs=64)
    assert Detector(VadSettings(threshold=1.0)).feed(at_16k) == []  # nothing reaches p = 1
    assert Detector(plain).feed(np.zeros(16_000 * 3, np.float32)) == []


def test_history_drops_the_oldest_turns_whole_and_truncation_keeps_what_was_played() -> None:
    h = History(max_items=4, max_audios=2)
    ids = []
    for k in range(3):
        ids += [f"u{k}", f"a{k}"]
        assert h.add(HistoryItem(f"u{k}", "message", "user", audio=np.zeros(160, np.float32))) == (
            [] if k < 2 else ["u0", "a0"]
        )
        h.add(HistoryItem(f"a{k}", "message", "assistant", text=f"answer {k}"))
    assert [it.id for it in h.items] == ["u1", "a1", "u2", "a2"]
    h.add(HistoryItem("c", "function_call", call_id="call_1", name="f"))  # 5 items: u1 goes, and a1 with it
    assert [it.id for it in h.items] == ["u2", "a2", "c"]
    assert played_prefix("the quick brown fox", 500, 1000) == "the quick"
    assert played_prefix("the quick brown fox", 1000, 1000) == "the quick brown fox"
    assert played_prefix("word", 100, 1000) == ""


@pytest.mark.parametrize("config", ["tiny_qwen2_5_omni.yaml", "tiny_qwen3_omni.yaml"])
def test_audio_token_counts_are_the_processors(config: str) -> None:
    """The history budget's audio counts (the prompt format's formula) against transformers'
    processor on the same tiny checkpoint, for lengths of whole hops (vLLM pads to them)."""
    from transformers import AutoProcessor

    from omni_mp.config.validate import load_config
    from omni_mp.http.pipeline import PipelineView
    from omni_mp.models.family import CountsAudio
    from omni_mp.models.registry import prompt_format, resolve_model

    stage = PipelineView.of(load_config(CONFIG_DIR / config)).text_stage
    assert stage is not None and stage.prompt_format is not None
    fmt = prompt_format(stage.prompt_format)
    assert isinstance(fmt, CountsAudio)
    proc = AutoProcessor.from_pretrained(resolve_model(stage.model))
    assert proc.audio_token == fmt.audio_placeholder
    for samples in (1600, 16_000, 16_160, 36_000, 160 * 777, 16_000 * 29):
        ids = proc(text=proc.audio_token, audio=[np.zeros(samples, np.float32)], return_tensors="np")["input_ids"]
        assert fmt.audio_tokens(samples) == ids.shape[-1], samples


def test_g711_codes_are_libsndfiles() -> None:
    """The server's G.711 (FFmpeg's pcm_mulaw / pcm_alaw through PyAV) against libsndfile's:
    every code decodes alike; every 16-bit sample encodes alike, or (at a rounding tie) to the
    other of the two levels around it."""
    from omni_mp.http.realtime.wire_audio import PCMA, PCMU, decode, encode

    x = np.arange(-32768, 32768).astype(np.int16)
    for fmt, subtype in ((PCMU, "ULAW"), (PCMA, "ALAW")):
        codes = bytes(range(256))
        theirs, _ = soundfile.read(
            io.BytesIO(codes), samplerate=8000, channels=1, format="RAW", subtype=subtype, dtype="int16"
        )
        assert (decode(fmt, codes) == theirs).all()
        buf = io.BytesIO()
        soundfile.write(buf, x, 8000, format="RAW", subtype=subtype)
        mine, ref = decode(fmt, encode(fmt, x)).astype(int), decode(fmt, buf.getvalue()).astype(int)
        tie = mine != ref
        assert tie.mean() < 0.02
        assert (np.minimum(mine, ref)[tie] <= x[tie]).all() and (x[tie] <= np.maximum(mine, ref)[tie]).all()


# ---- the served pipeline -----------------------------------------------------------------------


class Served:
    def __init__(self, pipeline: ServedPipeline, url: str) -> None:
        self.pipeline, self.url = pipeline, url
        self.ws = url.replace("http://", "ws://") + "/v1/realtime"
        self.openai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)
        self.chat = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def served(shared_tiny_qwen2_5_omni: tuple[ServedPipeline, str]) -> Served:
    return Served(*shared_tiny_qwen2_5_omni)  # tests/shared_servers.py: the bounds above


@pytest.fixture
def zmq(served: Served) -> Iterator[OmniClient]:
    with settled_client(served.pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


async def _until(conn: Any, kind: str, seen: list[Any], timeout_s: float = 300) -> Any:
    """Receive events (into `seen`) until one of type `kind`; it."""
    deadline = time.monotonic() + timeout_s
    while True:
        ev = await asyncio.wait_for(conn.recv(), max(1.0, deadline - time.monotonic()))
        seen.append(ev)
        if ev.type == kind:
            return ev
        assert ev.type != "error", ev


async def _say(conn: Any, text: str) -> None:
    """A user text message into the conversation."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await conn.conversation.item.create(item=item)


def _audio_of(events: list[Any], response_id: str | None = None) -> bytes:
    return b"".join(
        base64.b64decode(e.delta)
        for e in events
        if e.type == "response.output_audio.delta" and (response_id is None or e.response_id == response_id)
    )


def _wav_b64(samples_16k: np.ndarray) -> str:
    buf = io.BytesIO()
    soundfile.write(buf, samples_16k, 16_000, format="WAV", subtype="FLOAT")
    return base64.b64encode(buf.getvalue()).decode()


MANUAL = {"type": "realtime", "instructions": "Answer briefly.", "output_modalities": ["audio"],
          "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "Chelsie"}}}  # fmt: skip


def test_a_spoken_turn_with_the_openai_sdk_equals_chat_completions(served: Served) -> None:
    async def turn() -> tuple[list[Any], Any]:
        seen: list[Any] = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            created = await _until(conn, "session.created", seen)
            assert created.session.audio.output.format.rate == 24000
            await conn.session.update(session=MANUAL)  # type: ignore[arg-type]
            updated = await _until(conn, "session.updated", seen)
            assert (
                updated.session.audio.input.turn_detection is None and updated.session.audio.output.voice == "Chelsie"
            )
            for chunk in _chunks(_pcm16(SPEECH)):
                await conn.input_audio_buffer.append(audio=chunk)
            await conn.input_audio_buffer.commit()
            await _until(conn, "conversation.item.added", seen)
            await conn.response.create(response={"metadata": {"client_event_id": "lk-1"}})
            created_r = await _until(conn, "response.created", seen)
            assert created_r.response.metadata == {"client_event_id": "lk-1"}  # LiveKit matches on it
            done = await _until(conn, "response.done", seen)
        return seen, done

    seen, done = asyncio.run(turn())
    assert done.response.status == "completed" and done.response.usage.output_tokens > 0
    kinds = [e.type for e in seen]
    assert (
        kinds.index("input_audio_buffer.committed")
        < kinds.index("response.created")
        < kinds.index("response.output_item.added")
        < kinds.index("response.output_audio.delta")
        < kinds.index("response.output_audio.done")
        < kinds.index("response.done")
    )
    transcript = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
    assert transcript == next(e.transcript for e in seen if e.type == "response.output_audio_transcript.done")
    pcm = np.frombuffer(_audio_of(seen), dtype="<i2")
    assert len(pcm) > RATE // 10 and np.abs(pcm).max() > 100
    want_text, want_pcm, prompt_tokens = _chat_answer(served)
    assert transcript == want_text and done.response.usage.input_tokens == prompt_tokens
    assert len(want_pcm) == len(pcm) and np.abs(want_pcm.astype(int) - pcm.astype(int)).max() <= 1


def _chat_answer(served: Served) -> tuple[str, np.ndarray, int]:
    """The oracle of a spoken turn of SPEECH under "Answer briefly.": the same conversation
    through chat completions (the same 16 kHz audio): its transcript, PCM16, prompt tokens."""
    at_16k = soxr.resample(_pcm16_float(SPEECH), RATE, 16_000).astype(np.float32)
    r = served.chat.chat.completions.create(
        model="tiny", modalities=["text", "audio"], audio={"voice": "Chelsie", "format": "pcm16"},
        messages=[{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": _wav_b64(at_16k), "format": "wav"}}]}],
    )  # fmt: skip
    msg = r.choices[0].message
    assert msg.audio is not None and r.usage is not None
    return msg.audio.transcript, np.frombuffer(base64.b64decode(msg.audio.data), dtype="<i2"), r.usage.prompt_tokens


def _pcm16_float(x: np.ndarray) -> np.ndarray:
    """`x` as the server sees it once sent as PCM16."""
    return np.frombuffer(_pcm16(x), dtype="<i2").astype(np.float32) / 32768.0


VAD = {"type": "realtime", "output_modalities": ["audio"],
       "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 200, "silence_duration_ms": 400}}}}  # fmt: skip


def _turn_audio() -> bytes:
    return _pcm16(
        np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), SPEECH, np.zeros(int(TAIL_S * RATE), np.float32)])
    )


async def _vad_turn(served: Served, session: dict[str, Any], until: set[str]) -> list[Any]:
    """A session of `session`'s settings streams _turn_audio(): its events until all of `until`."""
    seen: list[Any] = []
    async with served.openai.realtime.connect(model="tiny") as conn:
        await _until(conn, "session.created", seen)
        await conn.session.update(session=session)  # type: ignore[arg-type]
        await _until(conn, "session.updated", seen)
        for chunk in _chunks(_turn_audio()):
            await conn.input_audio_buffer.append(audio=chunk)
        while not (until <= {e.type for e in seen}):
            seen.append(await asyncio.wait_for(conn.recv(), 300))
            assert seen[-1].type != "error", seen[-1]
    return seen


def test_server_vad_starts_and_ends_the_turn_and_answers(served: Served) -> None:
    seen = asyncio.run(_vad_turn(served, VAD, {"response.done"}))
    started = next(e for e in seen if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e.type == "input_audio_buffer.speech_stopped")
    speech_end_ms = (LEAD_S + len(SPEECH) / RATE) * 1000
    assert abs(started.audio_start_ms - (LEAD_S * 1000 - 200)) <= 64  # the voice's start less prefix_padding_ms
    assert speech_end_ms + 400 - 64 <= stopped.audio_end_ms <= speech_end_ms + 400 + 200
    committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
    assert committed.item_id == started.item_id == stopped.item_id
    done = next(e for e in seen if e.type == "response.done")
    assert done.response.status == "completed" and _audio_of(seen)


def test_barge_in_cancels_the_answer_in_every_stage(served: Served, zmq: OmniClient) -> None:
    """Speech while the answer plays: no audio delta after speech_started, response.done
    cancelled, the request gone from every stage; then the interrupted answer is truncated to
    what was played."""

    async def turn() -> tuple[list[Any], float, float]:
        seen: list[Any] = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session={**VAD, "max_output_tokens": "inf"})  # type: ignore[arg-type]
            await _until(conn, "session.updated", seen)
            for chunk in _chunks(_turn_audio()):
                await conn.input_audio_buffer.append(audio=chunk)
            await _until(conn, "response.output_audio.delta", seen)
            for chunk in _chunks(_pcm16(SPEECH[: RATE // 2])):  # the user talks over the answer
                await conn.input_audio_buffer.append(audio=chunk)
            await _until(conn, "input_audio_buffer.speech_started", seen)
            t0 = time.monotonic()
            done = await _until(conn, "response.done", seen)
            t_done = time.monotonic() - t0
            while zmq.status().inflight:  # every stage has freed it
                await asyncio.sleep(0.01)
            t_freed = time.monotonic() - t0
            assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
            item = next(e.item for e in seen if e.type == "response.output_item.added")
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=0)
            await _until(conn, "conversation.item.truncated", seen)
        return seen, t_done, t_freed

    seen, t_done, t_freed = asyncio.run(turn())
    kinds = [e.type for e in seen]
    first_started = kinds.index("input_audio_buffer.speech_started")
    barge = kinds.index("input_audio_buffer.speech_started", first_started + 1)
    assert "response.output_audio.delta" not in kinds[barge:]
    print(
        f"barge-in: speech_started -> response.done {t_done * 1000:.0f} ms, -> every stage freed {t_freed * 1000:.0f} ms"
    )
    assert t_freed < 10


def test_bad_input_is_an_error_event_for_that_session_only(served: Served) -> None:
    async def run() -> list[dict[str, Any]]:
        errors = []
        async with websockets.connect(served.ws, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            json.loads(await ws.recv())
            for frame in ("{not json", json.dumps({"type": "no.such.event"}),
                          json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x00\x01\x02").decode()}),
                          json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (70 << 10)}),
                          json.dumps({"type": "input_audio_buffer.append", "audio": "***"}),
                          json.dumps({"type": "session.update", "session": {"input_audio_format": "g722"}}),
                          json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "nobody"}}}}),
                          json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}),
                          json.dumps({"type": "response.cancel"}),
                          json.dumps({"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0, "audio_end_ms": 5}),
                          json.dumps({"type": "session.update", "session": {"instructions": 5}})):  # fmt: skip
                await ws.send(frame)
                errors.append(json.loads(await ws.recv()))
            # LiveKit's session.update: fields OpenAI's schema has and this server does not act on.
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "model": "gpt-realtime", "output_modalities": ["text"], "max_output_tokens": "inf",
                "tool_choice": "auto", "tracing": "auto", "truncation": "auto",
                "audio": {"input": {"transcription": {"model": "gpt-4o-mini-transcribe"}, "noise_reduction": None,
                                    "turn_detection": {"type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True}},
                          "output": {"voice": "marin", "speed": 1.0}}}}))  # fmt: skip
            errors.append(json.loads(await ws.recv()))
        return errors

    got = asyncio.run(run())
    codes = [e["error"]["code"] if e["type"] == "error" else e["type"] for e in got]
    assert codes == ["invalid_json", "unknown_event", "invalid_value", "input_audio_buffer_append_too_large", "invalid_value",
                     "unsupported_value", "invalid_value", "input_audio_buffer_commit_empty", "response_cancel_not_active",
                     "item_truncate_invalid_item_id", "invalid_value", "session.updated"]  # fmt: skip
    assert "PCM16" in got[2]["error"]["message"] and got[7]["error"]["event_id"] == "c1"
    assert "nobody" in got[6]["error"]["message"] and got[6]["error"]["param"] == "session.audio.output.voice"
    assert (
        got[10]["error"]["param"] == "session.instructions" and "Expected `str | null`" in got[10]["error"]["message"]
    )
    session = got[-1]["session"]
    assert (
        session["output_modalities"] == ["text"] and session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    )


def test_handshake_refusals_carry_a_reason(served: Served) -> None:
    async def refused(headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with pytest.raises(websockets.InvalidStatus) as err:
            async with websockets.connect(served.ws, additional_headers=headers):
                pass
        return err.value.response.status_code, json.loads(err.value.response.body)

    async def run() -> list[tuple[int, dict[str, Any]]]:
        out = [await refused({}), await refused({"Authorization": "Bearer wrong"})]
        auth = {"Authorization": f"Bearer {KEY}"}
        held = [await websockets.connect(served.ws, additional_headers=auth) for _ in range(MAX_SESSIONS)]
        try:
            out.append(await refused(auth))
        finally:
            for ws in held:
                await ws.close()
        await asyncio.sleep(0.5)
        async with websockets.connect(served.ws, additional_headers=auth) as ws:  # a place again
            assert json.loads(await ws.recv())["type"] == "session.created"
        return out

    got = asyncio.run(run())
    assert [s for s, _ in got] == [401, 401, 429]
    assert got[0][1]["error"]["code"] == "invalid_api_key" and "API key" in got[0][1]["error"]["message"]
    assert got[2][1]["error"]["code"] == "too_many_sessions" and str(MAX_SESSIONS) in got[2][1]["error"]["message"]


def test_beta_spellings_with_the_openai_beta_header(served: Served) -> None:
    async def run() -> list[dict[str, Any]]:
        seen = []
        headers = {"Authorization": f"Bearer {KEY}", "OpenAI-Beta": "realtime=v1"}
        async with websockets.connect(served.ws, additional_headers=headers) as ws:
            seen.append(json.loads(await ws.recv()))
            await ws.send(json.dumps({"type": "session.update", "session": {
                "modalities": ["text", "audio"], "voice": "alloy", "input_audio_format": "pcm16", "turn_detection": None}}))  # fmt: skip
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}}))  # fmt: skip
            await ws.send(json.dumps({"type": "response.create"}))
            while seen[-1]["type"] != "response.done":
                seen.append(json.loads(await ws.recv()))
                assert seen[-1]["type"] != "error", seen[-1]
        return seen

    seen = run_ = asyncio.run(run())
    kinds = {e["type"] for e in run_}
    assert seen[0]["session"]["modalities"] == ["text", "audio"] and seen[0]["session"]["input_audio_format"] == "pcm16"
    assert {
        "conversation.item.created",
        "response.audio.delta",
        "response.audio_transcript.delta",
        "response.audio.done",
    } <= kinds
    assert not kinds & {"conversation.item.added", "response.output_audio.delta", "conversation.item.done"}


def test_a_client_gone_mid_answer_has_its_request_aborted_and_others_go_on(served: Served, zmq: OmniClient) -> None:
    async def ask(text: str, until: str) -> Any:
        """A manual text turn; returns at the first `until` event (leaving: closing the socket)."""
        seen: list[Any] = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session=MANUAL)  # type: ignore[arg-type]
            await _say(conn, text)
            await conn.response.create()
            return await _until(conn, until, seen)

    async def both() -> Any:
        staying = asyncio.create_task(ask("Hi", "response.done"))
        await ask("Tell me a long story.", "response.output_audio.delta")  # closed mid-answer
        return await staying

    done = asyncio.run(both())
    assert done.response.status == "completed"
    deadline = time.monotonic() + 30
    while zmq.status().inflight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zmq.status().inflight == 0


def test_livekit_realtime_model_without_a_livekit_server(served: Served, tmp_path: Path) -> None:
    """LiveKit's `RealtimeModel(base_url=...)` session, as an AgentSession drives it (push audio,
    commit, generate_reply), needs no LiveKit server: its reply is the chat endpoint's answer."""
    (tmp_path / "in.pcm").write_bytes(_pcm16(SPEECH))
    got = client_script(
        "livekit_realtime", f"{served.url}/v1", KEY, "Chelsie", str(tmp_path / "in.pcm"), str(tmp_path / "lk.json")
    )
    pcm = got["pcm"]
    want_text, want_pcm, _ = _chat_answer(served)
    assert got["errors"] == [] and got["rates"] == [RATE]
    assert got["text"] == want_text
    assert len(pcm) == len(want_pcm) and np.abs(pcm.astype(int) - want_pcm.astype(int)).max() <= 1


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium from the system packages (apt-get install chromium)")
def test_playground_talk_mode_in_chromium_with_a_fake_microphone(served: Served, tmp_path: Path) -> None:
    """The playground's Talk button: Chromium's fake microphone plays a WAV of a caller (silence,
    speech, silence); the page streams it to /v1/realtime, the server's VAD ends the turn, the
    answer streams back and plays, and the turn shows in the history."""
    sync_api = pytest.importorskip("playwright.sync_api")
    wav = tmp_path / "caller.wav"
    soundfile.write(
        wav,
        np.concatenate([np.zeros(RATE // 2, np.float32), SPEECH, np.zeros(RATE * 30, np.float32)]),
        RATE,
        subtype="PCM_16",
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}%noloop"])  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(f"{served.url}/")
            page.fill("#api-key", KEY)
            page.select_option("#voice", "Chelsie")
            page.click("#talk")
            page.wait_for_function("window.talkLog.includes('response.done')", timeout=600_000)
            log = page.evaluate("window.talkLog")
            history = page.eval_on_selector_all("#history .turn", "ts => ts.map(t => t.textContent)")
            answer = page.text_content("#answer")
            player = page.eval_on_selector("#player", "e => e.src")
            page.click("#talk")  # stop
        finally:
            browser.close()
    order = ["session.created", "session.updated", "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "response.created", "response.output_audio.delta", "response.done"]  # fmt: skip
    assert [k for k in dict.fromkeys(log) if k in order] == order, log  # (first occurrences)
    assert "error" not in log
    assert history[0] == "You[spoken]" and history[1] == f"Model{answer} (spoken)" and answer
    assert player.startswith("blob:")


def test_an_idle_session_is_closed_with_a_reason(served: Served) -> None:
    async def run() -> tuple[float, Any]:
        async with websockets.connect(served.ws, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.recv()
            t0 = time.monotonic()
            with pytest.raises(websockets.ConnectionClosedOK) as closed:
                await asyncio.wait_for(ws.recv(), 60)
            return time.monotonic() - t0, closed.value.rcvd

    waited, frame = asyncio.run(run())
    assert IDLE_S - 0.5 <= waited <= IDLE_S + 5 and "idle" in frame.reason and "idle_timeout_s" in frame.reason


def test_the_sessions_benchmark_runs_on_the_tiny_pipeline(served: Served) -> None:
    """benchmarks/realtime_sessions.py's level at 2 sessions against this server (its quick check)."""
    from benchmarks.common.warmup import ONE_ROUND, Warmups
    from benchmarks.realtime_sessions import RATE as BENCH_RATE
    from benchmarks.realtime_sessions import chunks, level

    assert BENCH_RATE == RATE
    args = type("Args", (), {"tokens": 8, "rounds": 1})()
    audio = (chunks(np.concatenate([np.zeros(RATE // 2, np.float32), SPEECH, np.zeros(RATE, np.float32)])),
             chunks(np.zeros(RATE // 10, np.float32))[0])  # fmt: skip
    row = asyncio.run(
        level(served.ws, {"Authorization": f"Bearer {KEY}"}, 2, args, ["Chelsie"], audio, Warmups(ONE_ROUND))
    )
    assert row["turns"] == 2 and 0 < row["v2v_p50_ms"] <= row["v2v_p90_ms"] and row["longest_gap_ms"] >= 0


def test_truncate_keeps_in_the_history_only_what_was_played(served: Served) -> None:
    """An answer cut at half its audio: the next prompt holds the played part of its transcript
    (played_prefix), as the chat endpoint's prompt for that conversation counts it."""

    async def run() -> tuple[str, int, int]:
        seen: list[Any] = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session=MANUAL)  # type: ignore[arg-type]
            await _say(conn, "Hello")
            await conn.response.create()
            await _until(conn, "response.done", seen)
            item = next(e.item for e in seen if e.type == "response.output_item.added")
            transcript = next(e.transcript for e in seen if e.type == "response.output_audio_transcript.done")
            total_ms = len(_audio_of(seen)) // 2 * 1000 // RATE
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=total_ms // 2)
            await _until(conn, "conversation.item.truncated", seen)
            await _say(conn, "Go on.")
            await conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 1})
            done = await _until(conn, "response.done", seen)
        return transcript, total_ms, done.response.usage.input_tokens

    transcript, total_ms, input_tokens = asyncio.run(run())
    heard = played_prefix(transcript, total_ms // 2, total_ms)
    assert len(heard) < len(transcript)
    history = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hello"}]
    history += [{"role": "assistant", "content": heard}] if heard else []
    r = served.chat.chat.completions.create(model="tiny", max_completion_tokens=1,
                                            messages=[*history, {"role": "user", "content": "Go on."}])  # fmt: skip
    assert r.usage is not None and input_tokens == r.usage.prompt_tokens


def test_a_turn_past_max_turn_audio_s_is_refused_and_the_session_goes_on(served: Served) -> None:
    async def run() -> list[dict[str, Any]]:
        got = []
        async with websockets.connect(served.ws, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": None}}))
            await ws.recv()
            second = base64.b64encode(bytes(2 * RATE)).decode()  # 1 s of silence per append
            for _ in range(int(MAX_TURN_S) + 1):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": second}))
            got.append(json.loads(await ws.recv()))  # (appends within the bound answer nothing)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            got.append(json.loads(await ws.recv()))
        return got

    refused, committed = asyncio.run(run())
    assert refused["type"] == "error" and refused["error"]["code"] == "input_audio_buffer_full"
    assert "max_turn_audio_s=5" in refused["error"]["message"]
    assert committed["type"] == "input_audio_buffer.committed"  # the audio within the bound is kept


def test_an_audio_item_is_a_user_turn_and_one_response_runs_at_a_time(served: Served) -> None:
    """conversation.item.create with input_audio (not the buffer) gives the same answer; a second
    response.create while one runs is an error for it alone."""

    async def run() -> tuple[list[Any], Any]:
        seen: list[Any] = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session=MANUAL)  # type: ignore[arg-type]
            audio = base64.b64encode(_pcm16(SPEECH)).decode()
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}
            )
            await conn.response.create()
            await conn.response.create()
            errors: list[Any] = []
            while not any(e.type == "response.done" for e in seen):
                ev = await asyncio.wait_for(conn.recv(), 300)
                (errors if ev.type == "error" else seen).append(ev)
        return seen, errors

    seen, errors = asyncio.run(run())
    assert [e.error.code for e in errors] == ["conversation_already_has_active_response"]
    transcript = next(e.transcript for e in seen if e.type == "response.output_audio_transcript.done")
    want_text, want_pcm, _ = _chat_answer(served)
    pcm = np.frombuffer(_audio_of(seen), dtype="<i2")
    assert transcript == want_text and len(pcm) == len(want_pcm)


def test_items_are_retrieved_and_deleted(served: Served) -> None:
    async def run() -> list[dict[str, Any]]:
        got = []
        async with websockets.connect(served.ws, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.recv()
            item = {
                "id": "item_mine",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            }
            for ev in ({"type": "conversation.item.create", "item": item}, {"type": "conversation.item.retrieve", "item_id": "item_mine"},
                       {"type": "conversation.item.delete", "item_id": "item_mine"}, {"type": "conversation.item.retrieve", "item_id": "item_mine"}):  # fmt: skip
                await ws.send(json.dumps(ev))
                got.append(json.loads(await ws.recv()))
                if ev["type"] == "conversation.item.create":
                    got.append(json.loads(await ws.recv()))  # (added, then done)
        return got

    added, done, retrieved, deleted, missing = asyncio.run(run())
    assert added["type"] == "conversation.item.added" and done["type"] == "conversation.item.done"
    assert retrieved["type"] == "conversation.item.retrieved" and retrieved["item"]["content"] == [
        {"type": "input_text", "text": "Hi"}
    ]
    assert deleted == {**deleted, "type": "conversation.item.deleted", "item_id": "item_mine"}
    assert missing["error"]["code"] == "item_not_found" and missing["error"]["param"] == "item_id"


# ---- transcripts of the user's turns, the token bound, G.711 -----------------------------------


def _transcribed(served: Served, samples: np.ndarray, rate: int, subtype: str = "FLOAT") -> str:
    """/v1/audio/transcriptions' text for `samples` sent as a WAV file (the oracle)."""
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format="WAV", subtype=subtype)
    return served.chat.audio.transcriptions.create(model="tiny", file=("turn.wav", buf.getvalue())).text


TRANSCRIBED = {**MANUAL, "output_modalities": ["text"],
               "audio": {**MANUAL["audio"], "input": {**MANUAL["audio"]["input"], "transcription": {"model": "gpt-4o-transcribe"}}}}  # fmt: skip
DONE = "conversation.item.input_audio_transcription.completed"


async def _turn_with_transcript(conn: Any, chunks: list[str], seen: list[Any], answer: bool = True) -> tuple[Any, Any]:
    """Append, commit (and answer): the transcription's completed event and response.done (None
    without an answer), in either order."""
    for chunk in chunks:
        await conn.input_audio_buffer.append(audio=chunk)
    await conn.input_audio_buffer.commit()
    want = {DONE, "response.done"} if answer else {DONE}
    if answer:
        await conn.response.create()
    while not (want <= {e.type for e in seen}):
        seen.append(await asyncio.wait_for(conn.recv(), 300))
        assert seen[-1].type not in ("error", "conversation.item.input_audio_transcription.failed"), seen[-1]
    return next(e for e in seen if e.type == DONE), next((e for e in seen if e.type == "response.done"), None)


def test_user_turns_are_transcribed_as_the_transcriptions_endpoint_does(served: Served) -> None:
    """audio.input.transcription: the committed turn's transcript (deltas, then completed) is
    what /v1/audio/transcriptions says of the same audio, runs beside the answer, and stays in
    the item."""

    async def turn() -> tuple[list[Any], Any, Any, Any]:
        seen: list[Any] = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session=TRANSCRIBED)  # type: ignore[arg-type]
            updated = await _until(conn, "session.updated", seen)
            completed, done = await _turn_with_transcript(conn, _chunks(_pcm16(SPEECH)), seen)
            await conn.conversation.item.retrieve(item_id=completed.item_id)
            retrieved = await _until(conn, "conversation.item.retrieved", seen)
        return seen, updated, completed, retrieved

    seen, updated, completed, retrieved = asyncio.run(turn())
    assert updated.session.audio.input.transcription.model == "gpt-4o-transcribe"
    at_16k = soxr.resample(_pcm16_float(SPEECH), RATE, 16_000).astype(np.float32)
    want = _transcribed(served, at_16k, 16_000)
    assert want and completed.transcript == want
    deltas = [e for e in seen if e.type == "conversation.item.input_audio_transcription.delta"]
    assert "".join(e.delta for e in deltas) == want and {e.item_id for e in deltas} == {completed.item_id}
    committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
    assert completed.item_id == committed.item_id and completed.content_index == 0
    assert completed.usage.type == "tokens" and completed.usage.input_token_details.audio_tokens > 0
    assert retrieved.item.content[0].type == "input_audio" and retrieved.item.content[0].transcript == want
    kinds = [e.type for e in seen]
    assert kinds.index("response.created") < kinds.index(DONE)  # the answer did not wait for it


def test_a_transcript_that_cannot_be_made_fails_alone_and_the_answer_goes_on(served: Served) -> None:
    """A transcription prompt longer than the thinker's context (its bound is the endpoint's
    16384 characters, not the model's 2048 tokens): the turn's transcript fails with
    `...input_audio_transcription.failed` naming why, the answer to the same turn is made, and
    the session's next turn, with the prompt cleared, is transcribed."""
    long = {**TRANSCRIBED["audio"]["input"]["transcription"], "prompt": "the words of a long glossary " * 500}
    first = {
        **TRANSCRIBED,
        "audio": {**TRANSCRIBED["audio"], "input": {**TRANSCRIBED["audio"]["input"], "transcription": long}},
    }

    async def run() -> tuple[list[Any], Any]:
        seen: list[Any] = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session=first)  # type: ignore[arg-type]
            await _until(conn, "session.updated", seen)
            for chunk in _chunks(_pcm16(SPEECH)):
                await conn.input_audio_buffer.append(audio=chunk)
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            while not {"conversation.item.input_audio_transcription.failed", "response.done"} <= {e.type for e in seen}:
                seen.append(await asyncio.wait_for(conn.recv(), 300))
                assert seen[-1].type not in ("error", DONE), seen[-1]
            await conn.session.update(session=TRANSCRIBED)  # type: ignore[arg-type]
            await _until(conn, "session.updated", seen)
            completed, _ = await _turn_with_transcript(conn, _chunks(_pcm16(SPEECH)), seen, answer=False)
        return seen, completed

    seen, completed = asyncio.run(run())
    failed = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.failed")
    committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
    assert failed.item_id == committed.item_id and failed.content_index == 0
    assert failed.error.code == "context_length_exceeded" and "2048" in failed.error.message, failed.error
    done = next(e for e in seen if e.type == "response.done")
    assert done.response.status == "completed" and done.response.output[0].content[0].text
    assert completed.transcript == _transcribed(
        served, soxr.resample(_pcm16_float(SPEECH), RATE, 16_000).astype(np.float32), 16_000
    )


def _audio_item(pcm: bytes) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}],
    }


def test_history_is_bounded_in_tokens_dropping_the_oldest_turns(served: Served) -> None:
    """Seven user turns (4 s audios and short texts) past max_history_tokens: the response's prompt
    keeps the latest turns that fit; the oldest go (conversation.item.deleted). Oracle: the
    thinker's own prompt tokens for the same messages through chat completions."""
    speech = np.tile(SPEECH, 2)[: 4 * RATE]
    turns = [("audio", speech * (0.9 + 0.02 * k)) if k % 2 == 0 else ("text", f"Turn number {k}.") for k in range(7)]

    async def run() -> tuple[list[Any], list[str]]:
        seen: list[Any] = []
        ids = []
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session={**MANUAL, "output_modalities": ["text"]})  # type: ignore[arg-type]
            for kind, what in turns:
                if kind == "audio":
                    await conn.conversation.item.create(item=_audio_item(_pcm16(what)))  # type: ignore[arg-type]
                else:
                    await _say(conn, what)
                ids.append((await _until(conn, "conversation.item.added", seen)).item.id)
            await conn.response.create()
            await _until(conn, "response.done", seen)
        return seen, ids

    seen, ids = asyncio.run(run())
    deleted = [e.item_id for e in seen if e.type == "conversation.item.deleted"]
    kept = len(deleted)
    assert 0 < kept < len(turns) - 1 and deleted == ids[:kept]  # the oldest, in order
    done = next(e for e in seen if e.type == "response.done")
    assert done.response.status == "completed"

    def chat_prompt_tokens(first: int) -> int:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "Answer briefly."}]
        for kind, what in turns[first:]:
            if kind == "audio":
                at_16k = soxr.resample(_pcm16_float(what), RATE, 16_000).astype(np.float32)
                msgs.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_audio", "input_audio": {"data": _wav_b64(at_16k), "format": "wav"}}
                        ],
                    }
                )
            else:
                msgs.append({"role": "user", "content": what})
        r = served.chat.chat.completions.create(model="tiny", messages=msgs, max_tokens=1)  # type: ignore[arg-type]
        assert r.usage is not None
        return r.usage.prompt_tokens

    assert done.response.usage.input_tokens == chat_prompt_tokens(kept) <= HISTORY_TOKENS
    assert chat_prompt_tokens(kept - 1) > HISTORY_TOKENS  # one turn more would not have fit


def test_a_latest_turn_over_the_token_budget_fails_its_response_and_drops_nothing(served: Served) -> None:
    async def run() -> list[dict[str, Any]]:
        got = []
        async with websockets.connect(served.ws, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.recv()
            for text in ("Hi", "word " * (2 * HISTORY_TOKENS)):
                item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
                await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
                await ws.recv(), await ws.recv()  # (added, done)
            await ws.send(json.dumps({"type": "response.create", "event_id": "r1"}))
            got.append(json.loads(await ws.recv()))
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "nothing"}))
            got.append(json.loads(await ws.recv()))  # (nothing in between: no item was deleted)
        return got

    refused, then = asyncio.run(run())
    assert refused["type"] == "error" and refused["error"]["code"] == "context_length_exceeded"
    assert refused["error"]["event_id"] == "r1" and str(HISTORY_TOKENS) in refused["error"]["message"]
    assert then["type"] == "error" and then["error"]["code"] == "item_not_found"


def _mulaw_8k(x_24k: np.ndarray) -> tuple[np.ndarray, bytes]:
    """`x` at 8 kHz and its G.711 mu-law bytes by libsndfile (not the server's PyAV)."""
    x8 = np.clip(soxr.resample(x_24k, RATE, 8_000), -1, 1).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, x8, 8_000, format="RAW", subtype="ULAW")
    return x8, buf.getvalue()


def test_g711_in_and_out_match_pcm16_within_its_quantisation(served: Served) -> None:
    """A session in audio/pcmu: its user turn's transcript is the transcriptions endpoint's for
    the same mu-law audio; its answer to a text turn, decoded, is the PCM16 session's answer at
    8 kHz within G.711's quantisation. Beta's g711_alaw is taken and echoed."""
    x8, ulaw = _mulaw_8k(SPEECH)
    g711 = {**TRANSCRIBED, "output_modalities": ["audio"],
            "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None, "transcription": {}},
                      "output": {"format": {"type": "audio/pcmu"}, "voice": "Chelsie"}}}  # fmt: skip

    async def answer(session: dict[str, Any], audio_turn: bool) -> tuple[list[Any], Any, Any]:
        seen: list[Any] = []
        completed = None
        async with served.openai.realtime.connect(model="tiny") as conn:
            await _until(conn, "session.created", seen)
            await conn.session.update(session=session)  # type: ignore[arg-type]
            updated = await _until(conn, "session.updated", seen)
            if audio_turn:
                chunks = [base64.b64encode(ulaw[i : i + 800]).decode() for i in range(0, len(ulaw), 800)]
                completed, _ = await _turn_with_transcript(conn, chunks, seen, answer=False)
                await conn.conversation.item.delete(item_id=completed.item_id)
                await _until(conn, "conversation.item.deleted", seen)
                seen.clear()
            await _say(conn, "Hello")
            await conn.response.create()
            await _until(conn, "response.done", seen)
        return seen, updated, completed

    got, updated, completed = asyncio.run(answer(g711, True))
    want, _, _ = asyncio.run(answer(MANUAL, False))
    assert completed.transcript == _transcribed(served, x8, 8_000, "ULAW")
    assert (
        updated.session.audio.input.format.type == "audio/pcmu"
        and updated.session.audio.output.format.type == "audio/pcmu"
    )
    ulaw_out = _audio_of(got)
    decoded, _ = soundfile.read(
        io.BytesIO(ulaw_out), samplerate=8_000, channels=1, format="RAW", subtype="ULAW", dtype="int16"
    )
    ref = np.round(soxr.resample(np.frombuffer(_audio_of(want), dtype="<i2").astype(np.float32), RATE, 8_000)).astype(
        int
    )
    assert abs(len(decoded) - len(ref)) <= 2 and len(ref) > 800
    n = min(len(decoded), len(ref))
    err = np.abs(decoded[:n].astype(int) - ref[:n])
    assert (err <= np.abs(ref[:n]) / 16 + 40).all(), err.max()  # mu-law: ~4 bits of mantissa per segment
    assert np.abs(ref[:n]).max() > 100
    beta = asyncio.run(_beta_session(served, {"input_audio_format": "g711_alaw", "output_audio_format": "g711_alaw"}))
    assert beta["input_audio_format"] == beta["output_audio_format"] == "g711_alaw"


async def _beta_session(served: Served, fields: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEY}", "OpenAI-Beta": "realtime=v1"}
    async with websockets.connect(served.ws, additional_headers=headers) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": fields}))
        ev = json.loads(await ws.recv())
        assert ev["type"] == "session.updated", ev
        return ev["session"]


PIPECAT_SESSION = {"type": "realtime", "instructions": "Answer briefly.",
                   "audio": {"input": {"transcription": {"model": "gpt-realtime-whisper"},
                                       "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 200, "silence_duration_ms": 400}},
                             "output": {"voice": "Chelsie"}}}  # fmt: skip


def test_pipecat_realtime_service_holds_a_spoken_turn(served: Served, tmp_path: Path) -> None:
    """pipecat's OpenAIRealtimeLLMService (no other service needed): its audio turn, ended by
    the server's VAD, gets the answer and the user's transcript that the openai SDK's session
    with the same settings and audio gets."""
    (tmp_path / "in.pcm").write_bytes(_turn_audio())
    got = client_script(
        "pipecat_realtime", served.ws, KEY, "Chelsie", str(tmp_path / "in.pcm"), str(tmp_path / "pc.json")
    )

    seen = asyncio.run(_vad_turn(served, PIPECAT_SESSION, {DONE, "response.done"}))
    assert got["errors"] == [] and got["rates"] == [RATE]
    assert got["transcripts"] == [next(e.transcript for e in seen if e.type == DONE)]
    assert got["text"] == next(e.transcript for e in seen if e.type == "response.output_audio_transcript.done")
    want = np.frombuffer(_audio_of(seen), dtype="<i2")
    assert len(got["pcm"]) == len(want) > 0 and np.abs(got["pcm"].astype(int) - want.astype(int)).max() <= 1

"""Many `/v1/realtime` sessions at once, each a simulated caller: it streams pre-recorded speech
in real time (100 ms of PCM16 24 kHz every 100 ms: silence, the speech, silence, and silence
on until the answer is done), with server VAD on, and hears the answer out.

Per concurrency level (1, 8, 32, 64 by default), after one unmeasured warm-up turn per
session at that level (benchmarks.common.warmup), `--rounds` measured turns per session:
- voice-to-voice latency: from `input_audio_buffer.speech_stopped` to the answer's first
  `response.output_audio.delta`, both as the client receives them (p50 / p90 over every turn);
- the longest audio gap once an answer plays: the longest time a player that starts at the
  first delta and plays the deltas back to back would have had nothing to play (an underrun);
- the VAD's CPU per session: the server's Silero cost per 32 ms frame (measured here in this
  process on the same model and the same audio, `omni_mp.http.realtime.vad`) times the frames
  a session sends per second: the share of one core a session takes.

    python -m benchmarks.realtime_sessions [--config omni_mp/stage_configs/tiny_qwen2_5_omni.yaml]
        [--concurrency 1,8,32,64] [--rounds 2] [--tokens 24] [--speech FILE.wav] [--out FILE.json]
        [--url URL --api-key KEY]   (a server already serving --config)
    bash scripts/gpu/run.sh realtime_sessions --released --out /tmp/omni_mp_results/realtime_sessions.json
        (Qwen3-Omni at released sizes, random weights, on the GPU host)
    python -m benchmarks.realtime_sessions --vad-only   (the VAD's CPU cost alone, no server)

The speech defaults to benchmarks.common.speech.speechlike (2.25 s that Silero takes for a
voice); `--speech` takes a recording (any rate, mono or stereo)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr
import websockets

from benchmarks.common.served import free_port, released_qwen3_omni, start
from benchmarks.common.speech import speechlike
from benchmarks.common.stats import percentile_inclusive as pct
from benchmarks.common.warmup import ONE_ROUND, Warmups, warmup_line
from omni_mp.config.validate import load_config
from omni_mp.stage_configs import CONFIG_DIR

RATE = 24_000
CHUNK_S = 0.1
SILENCE_MS = 400  # the sessions' silence_duration_ms


def load_speech(path: Path | None) -> np.ndarray:
    if path is None:
        return speechlike()
    import soundfile

    audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
    return soxr.resample(audio.mean(axis=1), rate, RATE).astype(np.float32)


def chunks(audio: np.ndarray) -> list[str]:
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    step = int(RATE * CHUNK_S) * 2
    return [base64.b64encode(pcm[i : i + step]).decode() for i in range(0, len(pcm), step)]


class Turn:
    def __init__(self) -> None:
        self.stopped: float | None = None
        self.first_audio: float | None = None
        self.audio_s = 0.0
        self.longest_gap = 0.0
        self.done = asyncio.Event()

    def audio(self, now: float, seconds: float) -> None:
        if self.first_audio is None:
            self.first_audio = now
        else:  # the player's clock: it has played since first_audio, back to back
            self.longest_gap = max(self.longest_gap, now - (self.first_audio + self.audio_s))
        self.audio_s += seconds


async def _listen(ws: Any, turns: list[Turn]) -> None:
    async for raw in ws:
        ev = json.loads(raw)
        kind, now, turn = ev["type"], time.perf_counter(), turns[-1]
        if kind == "input_audio_buffer.speech_stopped" and turn.stopped is None:
            turn.stopped = now
        elif kind == "response.output_audio.delta":
            turn.audio(now, len(base64.b64decode(ev["delta"])) / 2 / RATE)
        elif kind == "response.done":
            turn.done.set()
        elif kind == "error":
            raise RuntimeError(f"server error: {ev['error']}")


async def session(
    url: str, headers: dict[str, str], voice: str, tokens: int, speech: list[str], silence: str, turns_n: int
) -> list[Turn]:
    """One caller: `turns_n` turns, each speech streamed in real time then silence until done."""
    turns: list[Turn] = []
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        json.loads(await ws.recv())  # session.created
        vad = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": SILENCE_MS}
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": tokens,
            "audio": {"input": {"turn_detection": vad}, "output": {"voice": voice}}}}))  # fmt: skip
        turns.append(Turn())
        listening = asyncio.create_task(_listen(ws, turns))
        try:
            for k in range(turns_n):
                if k:
                    turns.append(Turn())
                t0 = time.perf_counter()
                for i, chunk in enumerate(speech):
                    await _at(t0 + i * CHUNK_S, listening)
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
                i = len(speech)
                while not turns[-1].done.is_set():  # the caller's line stays open: silence
                    await _at(t0 + i * CHUNK_S, listening)
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
                    i += 1
        finally:
            listening.cancel()
    return turns


async def _at(when: float, listening: asyncio.Task[None]) -> None:
    if listening.done():
        listening.result()  # (raises what the listener met)
        raise RuntimeError("the server closed the session")
    await asyncio.sleep(max(0.0, when - time.perf_counter()))


def vad_cost(speech: np.ndarray) -> dict[str, float]:
    """Silero's CPU per 32 ms frame (process time, one thread) on this speech and silence."""
    from omni_mp.http.realtime.vad import FRAME, Detector, VadSettings

    audio = soxr.resample(np.concatenate([speech, np.zeros(RATE, np.float32)] * 20), RATE, 16_000).astype(np.float32)
    d = Detector(VadSettings())
    d.feed(audio[: FRAME * 10])  # warm
    t0 = time.process_time()
    d.feed(audio)
    per_frame = (time.process_time() - t0) / (len(audio) // FRAME - 10)
    frames_per_s = 16_000 / FRAME
    return {"cpu_ms_per_frame": 1000 * per_frame, "core_share_per_session": per_frame * frames_per_s}


async def level(
    url: str,
    headers: dict[str, str],
    c: int,
    args: argparse.Namespace,
    voices: list[str],
    audio: tuple[list[str], str],
    warmups: Warmups,
) -> dict[str, Any]:
    speech, silence = audio
    t0 = time.time()
    await asyncio.gather(
        *(session(url, headers, voices[i % len(voices)], args.tokens, speech, silence, 1) for i in range(c))
    )
    warmups.warmed(c, t0, c)
    t1 = time.time()
    got = await asyncio.gather(
        *(session(url, headers, voices[i % len(voices)], args.tokens, speech, silence, args.rounds) for i in range(c))
    )
    warmups.measured(c, t1)
    turns = [t for s in got for t in s if t.stopped is not None and t.first_audio is not None]
    lat = [1000 * (t.first_audio - t.stopped) for t in turns]  # type: ignore[operator]
    gaps = [1000 * t.longest_gap for t in turns]
    row = {"turns": len(turns), "v2v_p50_ms": statistics.median(lat), "v2v_p90_ms": pct(lat, 90),
           "longest_gap_ms": max(gaps), "gap_p90_ms": pct(gaps, 90)}  # fmt: skip
    print(f"{c:>4} | {row['turns']:>5} | {row['v2v_p50_ms']:>8.0f} {row['v2v_p90_ms']:>8.0f} | "
          f"{row['longest_gap_ms']:>9.0f} {row['gap_p90_ms']:>8.0f}", flush=True)  # fmt: skip
    return row


async def bench(args: argparse.Namespace, url: str, voices: list[str], headers: dict[str, str]) -> dict[str, Any]:
    speech_audio = load_speech(args.speech)
    lead = np.zeros(int(0.5 * RATE), np.float32)
    tail = np.zeros(int(1.0 * RATE), np.float32)
    audio = (chunks(np.concatenate([lead, speech_audio, tail])), chunks(np.zeros(int(RATE * CHUNK_S), np.float32))[0])
    warmups = Warmups(ONE_ROUND)
    print(f"{'conc':>4} | {'turns':>5} | {'v2v p50':>8} {'p90':>8} | {'longest gap':>9} {'gap p90':>8}   (ms)")
    levels = {str(c): await level(url, headers, c, args, voices, audio, warmups) for c in args.concurrency}
    return {"levels": levels, "vad": vad_cost(speech_audio), "warmup": warmups.to_json()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG_DIR / "tiny_qwen2_5_omni.yaml")
    p.add_argument("--concurrency", default="1,8,32,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--rounds", type=int, default=2, help="measured turns per session")
    p.add_argument("--tokens", type=int, default=24, help="thinker tokens per answer (max_output_tokens)")
    p.add_argument("--speech", type=Path, help="a recording to speak (default: a synthetic voice)")
    p.add_argument("--url", help="a server already serving --config (default: start one)")
    p.add_argument("--api-key", help="that server's key")
    released = "instead of --config: the shipped qwen3_omni.yaml on the released-size checkpoint (GPU)"
    p.add_argument("--released", action="store_true", help=released)
    p.add_argument("--frames", type=int, default=64, help="--released: codec frames per spoken answer")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "qwen3_omni_gpu")
    p.add_argument("--vad-only", action="store_true", help="only the VAD's CPU cost (no server)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.vad_only:
        print(_vad_line(vad_cost(load_speech(args.speech))))
        return 0
    if args.released:
        args.config = released_qwen3_omni(args.work_dir, args.tokens, args.frames)
    cfg = load_config(args.config)
    if max(args.concurrency) > cfg.http.realtime.max_sessions:
        p.error(f"--concurrency past the config's http.realtime.max_sessions={cfg.http.realtime.max_sessions}")
    proc = None
    if args.url is None:
        port = free_port()
        args.url = f"http://127.0.0.1:{port}"
        proc, _ = start(args.config, args.url)
    try:
        import httpx

        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        voices = httpx.get(f"{args.url}/v1/audio/voices", headers=headers, timeout=30).json()["data"]
        ws_url = args.url.replace("http://", "ws://") + "/v1/realtime"
        result = asyncio.run(bench(args, ws_url, [v["id"] for v in voices], headers))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
    print(_vad_line(result["vad"]))
    print(warmup_line(result["warmup"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"config": str(args.config), "device": _device(), **result}, indent=1))
    return 0


def _vad_line(v: dict[str, float]) -> str:
    share = 100 * v["core_share_per_session"]
    return f"VAD: {v['cpu_ms_per_frame']:.3f} ms CPU per 32 ms frame = {share:.2f} % of a core per session"


def _device() -> str:
    from benchmarks.common.phases import device_name

    return device_name()


if __name__ == "__main__":
    sys.exit(main())

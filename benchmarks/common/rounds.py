"""Request rounds of the omni pipelines (speech out), as benchmarks.omni_gpu,
benchmarks.qwen3_omni_gpu and benchmarks.peer_vllm_omni measure them: prompts, one request's
times (first audio, end, the silence a listener would hear), a round of concurrent requests or
a closed loop, their summary and the fixed-length checks that make rounds comparable."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.common.stats import percentile
from benchmarks.common.warmup import ONE_ROUND, Warmups, warmup_seed

SAMPLE_RATE = 24000  # the omni families' audio rate
Check = Callable[[list[list[int]], list[dict[str, Any]]], None]  # (prompts, their requests) -> raises


def token_prompts(n: int, length: int, seed: int, vocab: tuple[int, int] = (1000, 150000)) -> list[list[int]]:
    """Distinct random prompts; the default id range is plain text ids of the Qwen2.5 vocab."""
    rng = random.Random(seed)
    return [[rng.randrange(*vocab) for _ in range(length)] for _ in range(n)]


def chat_prompts(config: dict[str, Any], n: int, length: int, seed: int) -> list[list[int]]:
    """Distinct random user turns in the chat format Qwen3-Omni's talker reads (`config`: the
    checkpoint's config.json): <|im_start|>user\\n ... <|im_end|>\\n<|im_start|>assistant\\n,
    `length` ids in all (random text ids in between)."""
    newline = 198 if config["thinker_config"]["text_config"]["vocab_size"] > 150_000 else 10
    head = [config["im_start_token_id"], config["user_token_id"], newline]
    tail = [config["im_end_token_id"], newline, config["im_start_token_id"], config["assistant_token_id"], newline]
    special = {config[k] for k in config if k.endswith("_token_id") and isinstance(config[k], int)}
    special |= {config["thinker_config"][k] for k in ("audio_token_id", "image_token_id", "video_token_id")}
    top = min(special) if min(special) > 1000 else config["thinker_config"]["text_config"]["vocab_size"] // 2
    rng = random.Random(seed)
    body = max(1, length - len(head) - len(tail))
    out = []
    for _ in range(n):
        ids = []
        while len(ids) < body:
            t = rng.randrange(11, top)
            if t not in special:
                ids.append(t)
        out.append(head + ids + tail)
    return out


class Playback:
    """A player that starts a request's audio as its first chunk arrives and plays every chunk
    in order: the silence it would hit after that (a chunk arriving after the audio before it
    has played out), the stalls a streaming listener hears."""

    def __init__(self) -> None:
        self.ends_at: float | None = None  # when the audio received so far has played out
        self.stall_s = 0.0
        self.stalls = 0

    def chunk(self, now: float, seconds: float) -> None:
        if self.ends_at is None:  # the first chunk starts playback
            self.ends_at = now
        elif now > self.ends_at:  # the audio ran out before this chunk came
            self.stall_s += now - self.ends_at
            self.stalls += 1
            self.ends_at = now
        self.ends_at += seconds


async def audio_request(client: Any, prompt: list[int], t0: float) -> dict[str, Any]:
    """One streamed request through omni_mp's client: first audio, end and audio length from
    `t0`, the thinker's token count, the silence a listener would hear."""
    from omni_mp.wire.messages import Finished
    from omni_mp.wire.outputs import chunk_audio

    first, samples, rate, fin = None, 0, SAMPLE_RATE, None
    playback = Playback()
    async for ev in client.stream(prompt_token_ids=prompt, timeout_s=1800):
        now = time.perf_counter()
        if isinstance(ev, Finished):
            fin = ev
            break
        got = chunk_audio(ev)
        if got is not None and got[0].numel():
            first = first if first is not None else now
            samples, rate = samples + got[0].numel(), got[1]
            playback.chunk(now, got[0].numel() / got[1])
    done = time.perf_counter()
    assert fin is not None
    streamed = first is not None
    for out in fin.outputs:  # one-shot stages deliver the audio with Finished
        if out.audio is not None and out.sample_rate:
            samples, rate = max(samples, out.audio.numel()), out.sample_rate
            first = first if first is not None else done
    entry = min(fin.stage_timings, key=lambda d: d.stage_id)
    return {
        "first_s": (first if first is not None else done) - t0,
        "done_s": done - t0,
        "audio_s": samples / rate,
        "thinker_tokens": entry.num_output_tokens,
        "stall_s": playback.stall_s,
        "streamed": streamed,  # audio came in chunks before Finished (False: all of it at the end)
    }


def check_round(batch: list[list[int]], reqs: list[dict[str, Any]], thinker_tokens: int, audio_s: float) -> None:
    """Fixed lengths, distinct prompts: what makes rounds (and systems) comparable."""
    if len({tuple(p) for p in batch}) != len(batch):
        raise RuntimeError("prompts of a round are not distinct")
    bad = [r for r in reqs if abs(r["audio_s"] - audio_s) > 1e-6 or r["thinker_tokens"] != thinker_tokens]
    if bad:
        raise RuntimeError(
            f"{len(bad)} of {len(reqs)} requests differ from the fixed lengths ({thinker_tokens} thinker tokens, "
            f"{audio_s:.3f} s of audio), e.g. {bad[0]['thinker_tokens']} tokens, {bad[0]['audio_s']:.3f} s"
        )


def round_summary(reqs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """The stream-phase fields of a round or a closed loop (`audio_request`'s per-request times)."""
    firsts = [r["first_s"] for r in reqs]
    audio = sum(r["audio_s"] for r in reqs)
    return {
        "requests": len(reqs),
        "wall_s": wall,
        "first_audio_p50_s": statistics.median(firsts),
        "first_audio_p90_s": percentile(firsts, 0.9),
        "first_audio_mean_s": statistics.fmean(firsts),
        # per request: time from submit to its last audio over the audio's length
        "rtf_mean": statistics.fmean(r["done_s"] / r["audio_s"] for r in reqs if r["audio_s"]),
        "audio_s_per_s": audio / wall,
        "thinker_tok_s": sum(r["thinker_tokens"] for r in reqs) / wall,
        "audio_s_per_request": audio / len(reqs),
        # silence a listener playing from the first chunk would hear (`Playback`), per request
        "stall_mean_s": statistics.fmean(r.get("stall_s", 0.0) for r in reqs),
        "stall_max_s": max(r.get("stall_s", 0.0) for r in reqs),
        # requests whose audio came in chunks before their end (a stream phase wants all of them)
        "streamed_requests": sum(bool(r.get("streamed")) for r in reqs),
    }


async def audio_round(endpoint: str, batch: list[list[int]], check: Check | None = None) -> dict[str, Any]:
    """One round of concurrent requests through omni_mp's client, checked by `check` (the
    family's fixed lengths) if given."""
    from omni_mp.client.omni_client import AsyncOmniClient

    async with AsyncOmniClient(endpoint) as client:
        t0 = time.perf_counter()
        reqs = await asyncio.gather(*(audio_request(client, p, t0) for p in batch))
        wall = time.perf_counter() - t0
    if check is not None:
        check(batch, list(reqs))
    return round_summary(list(reqs), wall)


async def closed_loop(
    one: Callable[[list[int], float], Awaitable[dict[str, Any]]], batch: list[list[int]], concurrency: int
) -> tuple[list[dict[str, Any]], float]:
    """`batch`'s requests with at most `concurrency` in flight, each finished one replaced by the
    next: what vLLM's `bench serve --max-concurrency C --num-prompts N` does, and how the
    published vllm-omni figures were taken. After the first C, requests arrive one at a time into
    a running batch instead of all at once. `one(prompt, t_submit)` runs one request and times it
    from its own submission. Returns the requests (in completion order) and the wall time."""
    todo = iter(batch)
    reqs: list[dict[str, Any]] = []

    async def worker() -> None:
        for prompt in todo:  # one shared iterator: each prompt is taken once
            reqs.append(await one(prompt, time.perf_counter()))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(batch)))))
    return reqs, time.perf_counter() - t0


async def closed_loop_round(
    endpoint: str, batch: list[list[int]], concurrency: int, check: Check | None = None
) -> dict[str, Any]:
    """`closed_loop` of omni_mp's client, the requests checked by `check` (lengths) if given."""
    from omni_mp.client.omni_client import AsyncOmniClient

    async with AsyncOmniClient(endpoint) as client:
        reqs, wall = await closed_loop(lambda p, t0: audio_request(client, p, t0), batch, concurrency)
    if check is not None:
        check(batch, reqs)
    return {**round_summary(reqs, wall), "concurrency": concurrency}


def playback_line(st: dict[str, Any], concurrency: list[int]) -> str | None:
    """The silence a listener would hear per request (`Playback`), mean / max at each level of
    a streaming phase's results; None where none was measured."""
    levels = [(c, st[str(c)]) for c in concurrency if "stall_mean_s" in st.get(str(c), {})]
    if not levels:
        return None
    return "\nplayback from each request's first audio (stream), silence per request mean / max: " + ", ".join(
        f"c={c} {a['stall_mean_s']:.2f} / {a['stall_max_s']:.2f} s" for c, a in levels
    )


def level_line(label: str, c: int, best: dict[str, Any]) -> str:
    """A measured level's progress line."""
    return (
        f"{label} c={c}: first audio p50 {best['first_audio_p50_s'] * 1000:.0f} ms, "
        f"p90 {best['first_audio_p90_s'] * 1000:.0f} ms, RTF {best['rtf_mean']:.3f}, "
        f"{best['audio_s_per_s']:.2f} audio s/s, {best['thinker_tok_s']:.0f} thinker tok/s, "
        f"{best['audio_s_per_request']:.2f} s audio/request"
    )


def measure_levels(
    endpoint: str,
    levels: list[int],
    rounds: int,
    batch: Callable[[int, int], list[list[int]]],
    check: Check | None,
    say: Callable[[str], None],
    label: str,
) -> tuple[dict[str, Any], dict[int, tuple[float, float]], Warmups]:
    """Per concurrency level, in order: one unmeasured warm-up round at that level (its shapes'
    first runs: benchmarks.common.warmup), then `rounds` measured rounds, the best (least wall
    time) kept. `batch(c, seed)`: c distinct prompts (seeds: warmup_seed(c) for the warm-up,
    1000 x c + round for the measured rounds). Returns the best round per level (keyed str(c)),
    each level's last measured round's window (time.time(), for the stage timelines) and the
    warm-up record."""
    best_of: dict[str, Any] = {}
    windows: dict[int, tuple[float, float]] = {}
    warmups = Warmups(ONE_ROUND)
    for c in levels:
        t0 = time.time()
        warm = asyncio.run(audio_round(endpoint, batch(c, warmup_seed(c)), check))
        warmups.warmed(c, t0, c)
        say(f"{label} c={c}: warm-up round {warm['wall_s']:.1f}s (not measured)")
        runs = []
        for r in range(rounds):
            t_round = time.time()
            runs.append(asyncio.run(audio_round(endpoint, batch(c, 1000 * c + r), check)))
            windows[c] = (t_round, time.time())
            warmups.measured(c, t_round)
        best = best_of[str(c)] = min(runs, key=lambda x: x["wall_s"])
        say(level_line(label, c, best))
    return best_of, windows, warmups

"""Qwen3-TTS served over HTTP: open-loop Poisson arrivals of streamed `/v1/audio/speech` requests.

For each rate (requests/s, ascending), requests arrive at seeded exponential gaps for
`--duration` seconds after an unmeasured warm-up at that rate (`--warmup` seconds); each is a
sentence of 8-20 words in a preset voice, `response_format: pcm` (16-bit mono at 24 kHz) read as
it streams (`stream_format: "audio"`: raw PCM chunks as decoded, omni_mp's default and vllm-omni's
opt-in, so the same request measures either server: scripts/gpu/tts_peer.sh serves vllm-omni
0.25.0rc1 on the same checkpoint, benchmarks.peer_tts_serve). Per rate:

- time to first audio p50 / p95: from sending the request to its first audio bytes;
- playback underruns: a listener starts playing at the first chunk in real time and pauses
  whenever the next bytes have not arrived; the requests that paused at all (> UNDERRUN_S) and
  the total pause;
- real-time factor: stream (first byte to last) / audio seconds, and generation (sent to last
  byte) / audio seconds;
- achieved rate (requests sent / window), errors (non-200, no audio, or unfinished after
  `--drain` seconds); then the highest rate held with p95 <= `--target-ms` and no errors;
- where the first audio went (omni_mp's server only, from its `/metrics` before and after the
  window: benchmarks.common.served_metrics): per stage, the mean time from its receipt of the
  request to being in its engine and to its first output, and the server's time to the first audio bytes;
- audio length against the request's frames ((max_new_tokens - 1) x 1920 samples): the requests
  more than a frame short or at all long (EOS not suppressed, or a server's decoder dropping audio).

Every request's length is fixed (`max_new_tokens`: FRAMES_PER_WORD frames a word, + 1 step), and
with `--fixed-length` (the released random-weight checkpoint: it may never say EOS, or say it at
once) the stage suppresses EOS too (benchmarks.common.served.released_qwen3_tts), so each request
yields exactly that audio. Rates after one that left requests unfinished are skipped (it only gets
worse). Prints a table; `--out` writes JSON (`--system` names the server in it); `--compare A B`
prints two such files side by side (omni_mp's and vllm-omni's) and exits.

    python -m benchmarks.tts_serving [--config omni_mp/stage_configs/tiny_qwen3_tts.yaml]
        [--serving URL] [--rates 5,10,20,40] [--duration 20] [--voice vivian] [--out FILE.json]
    python -m benchmarks.tts_serving --write-released DIR   (the GPU run's config: scripts/gpu/tts_benchmark.sh)
    python -m benchmarks.tts_serving --compare tts_serving.json tts_peer.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import served_metrics
from benchmarks.common.phases import device_name
from benchmarks.common.report import fmt, make_say
from benchmarks.common.served import measure_served, released_qwen3_tts
from benchmarks.common.stats import percentile
from benchmarks.common.timelines import read_timelines, stage_step_summary
from benchmarks.common.tts_sentences import SENTENCES
from benchmarks.common.warmup import Warmups, warmup_line
from omni_mp.stage_configs import CONFIG_DIR

SAMPLE_RATE = 24_000
BYTES_PER_SAMPLE = 2  # pcm: 16-bit mono
SAMPLES_PER_FRAME = 1920  # 12.5 frames a second
FRAMES_PER_WORD = 5  # ~2.5 words a second of speech
OMNI_MP = "omni_mp"  # --system's default: this project's server
UNDERRUN_S = 0.001  # a pause shorter than this is not counted


def max_new_tokens(text: str) -> int:
    """Talker steps for `text`: FRAMES_PER_WORD frames a word (N steps give N - 1 frames)."""
    return FRAMES_PER_WORD * len(text.split()) + 1


@dataclass
class Result:
    sent: float  # time.perf_counter() when sent
    expected: int = 0  # samples the request's frames make
    first: float | None = None
    last: float | None = None
    samples: int = 0
    stall_s: float = 0.0
    error: str | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, bytes)

    def playback(self) -> None:
        """Pauses of a listener who starts at the first chunk and plays in real time."""
        if not self.chunks:
            return
        start, played, stall = self.chunks[0][0], 0, 0.0
        for arrival, nbytes in self.chunks:
            due = start + stall + played / (SAMPLE_RATE * BYTES_PER_SAMPLE)  # when the listener needs it
            if arrival > due:
                stall += arrival - due
            played += nbytes
        self.stall_s = stall


async def speak(http: httpx.AsyncClient, url: str, text: str, voice: str, res: Result) -> None:
    body = {"model": "tts", "input": text, "voice": voice, "response_format": "pcm", "stream_format": "audio",
            "max_new_tokens": max_new_tokens(text)}  # fmt: skip
    res.expected = (body["max_new_tokens"] - 1) * SAMPLES_PER_FRAME
    try:
        async with http.stream("POST", f"{url}/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for chunk in r.aiter_raw():
                now = time.perf_counter()
                if chunk:
                    res.first = res.first or now
                    res.last = now
                    res.chunks.append((now, len(chunk)))
                    res.samples += len(chunk) // BYTES_PER_SAMPLE
        if not res.samples:
            res.error = "no audio"
    except (httpx.HTTPError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"


async def run_rate(
    http: httpx.AsyncClient,
    url: str,
    voice: str,
    rate: float,
    seconds: float,
    seed: int,
    drain_s: float,
    warm: bool = False,
) -> tuple[list[Result], float, int]:
    """Poisson arrivals at `rate` for `seconds`: the results, the arrival window's length and the
    requests still unfinished `drain_s` after it (cancelled, counted as errors). `warm`: the
    first request at once (a warm-up sends at least one)."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[None]] = []
    results: list[Result] = []
    t0 = time.perf_counter()
    at = 0.0 if warm else rng.expovariate(rate)
    while at < seconds:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        res = Result(sent=time.perf_counter())
        results.append(res)
        tasks.append(asyncio.create_task(speak(http, url, rng.choice(SENTENCES), voice, res)))
        at += rng.expovariate(rate)
    window = time.perf_counter() - t0
    _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    for t in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    for res in results:
        if res.error is None and res.last is None:
            res.error = "unfinished"
    return results, window, len(pending)


def summarize(rate: float, results: list[Result], window: float, unfinished: int) -> dict[str, Any]:
    ok = [r for r in results if r.error is None and r.first is not None and r.last is not None]
    for r in ok:
        r.playback()
    ttfa = [(r.first - r.sent) * 1000 for r in ok]  # type: ignore[operator]
    audio = [r.samples / SAMPLE_RATE for r in ok]
    stream_rtf = [(r.last - r.first) / a for r, a in zip(ok, audio, strict=True) if a > 0]  # type: ignore[operator]
    gen_rtf = [(r.last - r.sent) / a for r, a in zip(ok, audio, strict=True) if a > 0]  # type: ignore[operator]
    stalled = [r for r in ok if r.stall_s > UNDERRUN_S]
    short = [r for r in ok if r.samples < r.expected - SAMPLES_PER_FRAME]
    long = [r for r in ok if r.samples > r.expected]
    errors = [r.error for r in results if r.error is not None]
    return {
        "rate": rate,
        "sent": len(results),
        "achieved_rate": len(results) / window if window else 0.0,
        "ok": len(ok),
        "errors": len(errors),
        "unfinished": unfinished,
        "error_examples": sorted(set(errors))[:3],
        "ttfa_p50_ms": percentile(ttfa, 0.5) if ttfa else None,
        "ttfa_p95_ms": percentile(ttfa, 0.95) if ttfa else None,
        "ttfa_max_ms": max(ttfa) if ttfa else None,
        "underrun_requests": len(stalled),
        "underrun_share": len(stalled) / len(ok) if ok else None,
        "stall_total_ms": 1000 * sum(r.stall_s for r in ok),
        "audio_s_mean": sum(audio) / len(audio) if audio else None,
        "audio_short": len(short),  # more than a frame short of the request's frames
        "audio_long": len(long),
        "audio_ratio_mean": sum(r.samples / r.expected for r in ok) / len(ok) if ok else None,
        "stream_rtf_p50": percentile(stream_rtf, 0.5) if stream_rtf else None,
        "gen_rtf_p50": percentile(gen_rtf, 0.5) if gen_rtf else None,
        "gen_rtf_p95": percentile(gen_rtf, 0.95) if gen_rtf else None,
    }


HEADER = (f"{'rate':>5} {'got/s':>6} {'ok':>5} {'err':>4} | {'TTFA p50':>8} {'p95':>7} | "
          f"{'underrun':>8} {'stall ms':>8} | {'RTF strm':>8} {'gen p50':>7} {'p95':>6}")  # fmt: skip


def row(s: dict[str, Any]) -> str:
    share = "-" if s["underrun_share"] is None else f"{s['underrun_requests']}/{s['ok']}"
    return (
        f"{s['rate']:>5g} {s['achieved_rate']:>6.2f} {s['ok']:>5} {s['errors']:>4} | "
        f"{fmt(s['ttfa_p50_ms'], '{:.1f}'):>8} {fmt(s['ttfa_p95_ms'], '{:.1f}'):>7} | "
        f"{share:>8} {s['stall_total_ms']:>8.0f} | {fmt(s['stream_rtf_p50']):>8} "
        f"{fmt(s['gen_rtf_p50']):>7} {fmt(s['gen_rtf_p95']):>6}"
    )


def held(levels: list[dict[str, Any]], target_ms: float) -> float | None:
    """The highest rate with p95 time to first audio <= target and no errors."""
    good = [s["rate"] for s in levels if s["errors"] == 0 and s["ttfa_p95_ms"] is not None
            and s["ttfa_p95_ms"] <= target_ms]  # fmt: skip
    return max(good) if good else None


def compare(paths: list[Path]) -> list[str]:
    """Markdown lines: two result files (omni_mp's, then its peer's) side by side per rate, and
    their held rates (issue 50's bar: omni_mp's at least 2x the peer's)."""

    docs = [json.loads(p.read_text()) for p in paths]
    names = [d.get("system") or p.stem for d, p in zip(docs, paths, strict=True)]
    levels = [{s["rate"]: s for s in d["levels"]} for d in docs]
    lines = [f"device: {' / '.join(sorted({str(d.get('device')) for d in docs}))}; {names[0]} / {names[1]}",
             "| rate /s | TTFA p50 ms | TTFA p95 ms | underruns | gen RTF p50 | short audio | errors |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for rate in sorted(set(levels[0]) | set(levels[1])):
        a, b = levels[0].get(rate), levels[1].get(rate)

        def pair(key: str, spec: str = "{:.1f}", a: Any = a, b: Any = b) -> str:
            return " / ".join(fmt(x.get(key), spec) if x else "not run" for x in (a, b))  # a field older files lack: -

        under = " / ".join(f"{x['underrun_requests']}/{x['ok']}" if x else "not run" for x in (a, b))
        rest = f"{pair('gen_rtf_p50', '{:.3f}')} | {pair('audio_short', '{}')} | {pair('errors', '{}')}"
        lines.append(f"| {rate:g} | {pair('ttfa_p50_ms')} | {pair('ttfa_p95_ms')} | {under} | {rest} |")
    held = [d.get("held_rate") for d in docs]
    ratio = f" ({held[0] / held[1]:.1f}x)" if held[0] and held[1] else ""
    target = docs[0].get("target_ms")
    lines.append(f"held at p95 <= {target} ms: {' / '.join('none' if h is None else f'{h:g}/s' for h in held)}{ratio}")
    return lines


async def bench(args: argparse.Namespace, url: str) -> dict[str, Any]:
    say = make_say("tts_serving")
    warmups = Warmups(f"{args.warmup:g} s of unmeasured arrivals at each rate, just before it is measured")
    levels: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.drain + args.duration), limits=limits) as http:
        voice = args.voice or (await http.get(f"{url}/v1/models")).json()["data"][0]["voices"][0]
        say(f"voice {voice!r}; {FRAMES_PER_WORD} frames a word ({len(SENTENCES)} sentences, 8-20 words)")
        print(HEADER, flush=True)
        for i, rate in enumerate(args.rates):
            t0 = time.time()
            if args.warmup > 0:
                warm, _, _ = await run_rate(http, url, voice, rate, args.warmup, 1_000_000 + i, args.drain, True)
                warmups.warmed(rate, t0, len(warm))
            t1 = time.time()
            before = await served_metrics.scrape(http, url)
            results, window, unfinished = await run_rate(http, url, voice, rate, args.duration, args.seed + i,
                                                         args.drain)  # fmt: skip
            warmups.measured(rate, t1)
            s = summarize(rate, results, window, unfinished)
            s["wall"] = [t1, time.time()]  # its arrivals and drain (time.time()): stage timelines' clock
            # omni_mp's own /metrics: where the first audio went (None for another server)
            s["first_audio_parts_ms"] = served_metrics.breakdown(before, await served_metrics.scrape(http, url))
            levels.append(s)
            print(row(s), flush=True)
            if parts := served_metrics.line(s["first_audio_parts_ms"]):
                say(f"{rate:g}/s, {parts}")
            if s["error_examples"]:
                say(f"errors at {rate:g}/s: {s['error_examples']}")
            if s["audio_short"] or s["audio_long"]:
                say(f"audio length at {rate:g}/s: {s['audio_short']} requests more than a frame short, "
                    f"{s['audio_long']} long (mean {fmt(s['audio_ratio_mean'])} of their frames)")  # fmt: skip
            if unfinished:
                say(f"{unfinished} requests unfinished {args.drain:g} s after the window: higher rates skipped")
                break
    return {"levels": levels, "held_rate": held(levels, args.target_ms), "warmup": warmups.to_json()}


def add_stage_summary(out: Path | None, profile_dir: Path) -> list[str]:
    """Each rate's stage steps (benchmarks.common.timelines: steps, step time, how busy each
    stage's engine thread was) into `out`'s JSON as "stages"; the table printed."""
    if out is None or not out.is_file():
        raise SystemExit("--timelines needs --out, the run's JSON")
    doc = json.loads(out.read_text())
    windows = {lv["rate"]: tuple(lv["wall"]) for lv in doc["levels"] if "wall" in lv}
    if not windows:
        raise SystemExit(f"{out}: no level records its wall-clock window (an older run)")
    stages = stage_step_summary(read_timelines(profile_dir, min(w[0] for w in windows.values())), windows)
    doc["stages"] = stages
    out.write_text(json.dumps(doc, indent=1))
    lines = ["| rate/s | stage | steps | step ms p50 | mean | busy | requests a step |", "|---" * 7 + "|"]
    for rate, level in stages.items():
        for sid, st in level.items():
            lines.append(
                f"| {rate} | {sid} | {st['steps']} | {st['step_ms_p50']:.2f} | {st['step_ms_mean']:.2f} "
                f"| {st['busy']:.0%} | {st['reqs_per_step_mean']:.1f} |"
            )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--config", type=Path, default=CONFIG_DIR / "tiny_qwen3_tts.yaml", help="served here unless --serving"
    )
    p.add_argument("--serving", help="measure the server at this URL instead of starting --config")
    p.add_argument("--rates", default="5,10,20,40", type=lambda s: [float(x) for x in s.split(",") if x])
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds of arrivals per rate")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds of arrivals before each rate")
    p.add_argument("--drain", type=float, default=30.0, help="seconds to wait for a rate's last requests")
    p.add_argument("--voice", help="a preset voice (default: the server's first)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-ms", type=float, default=100.0, help="p95 time to first audio a held rate keeps")
    p.add_argument("--fixed-length", action="store_true", help="say so in the output: the config suppresses EOS")
    p.add_argument("--out", type=Path)
    p.add_argument("--system", default=OMNI_MP, help="the measured server's name, in --out")
    p.add_argument("--compare", type=Path, nargs=2, metavar="JSON", help="print two --out files side by side, exit")
    p.add_argument(
        "--timelines", type=Path, metavar="DIR",
        help="add to --out (a finished run's file) each rate's stage step summary from the stage "
        "timelines in DIR (the server's OMNI_MP_PROFILE_DIR, written when it stopped), print it, exit",
    )  # fmt: skip
    released = "write the released-size checkpoint and its served config under DIR, print the config's path, exit"
    p.add_argument("--write-released", type=Path, metavar="DIR", help=released)
    args = p.parse_args()
    if args.write_released:
        print(released_qwen3_tts(args.write_released), flush=True)
        return 0
    if args.compare:
        print("\n".join(compare(args.compare)), flush=True)
        return 0
    if args.timelines:
        print("\n".join(add_stage_summary(args.out, args.timelines)), flush=True)
        return 0
    say = make_say("tts_serving")
    device = device_name()
    say(f"device: {device}; rates {args.rates} /s, {args.duration:g} s each after {args.warmup:g} s warm-up")
    length = "EOS suppressed: every request exactly" if args.fixed_length else "at most"
    say(f"request length: {length} {FRAMES_PER_WORD} frames ({FRAMES_PER_WORD / 12.5:.2f} s of audio) a word")
    serving = None if args.serving is None else (args.serving, "")
    result = measure_served(args.config, serving, lambda url, _endpoint: bench(args, url))
    held_rate = result["held_rate"]
    say(f"highest rate held with p95 time to first audio <= {args.target_ms:g} ms: "
        f"{'none' if held_rate is None else f'{held_rate:g}/s'}")  # fmt: skip
    print(warmup_line(result["warmup"]), flush=True)
    doc = {
        "system": args.system, "device": device,
        # the config omni_mp served; another system's server (--system) has its own
        "config": str(args.config) if args.system == OMNI_MP else None, "serving": args.serving,
        "fixed_length": args.fixed_length,
        "frames_per_word": FRAMES_PER_WORD, "duration_s": args.duration, "target_ms": args.target_ms, **result,
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

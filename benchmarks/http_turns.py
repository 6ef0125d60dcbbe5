"""Time to first audio, turn by turn, of spoken conversations through the HTTP server.

`--conversations` conversations at once, each `--turns` turns: turn k sends the whole history
(the user's earlier messages and each earlier answer back by its `audio.id`, as OpenAI's
clients continue a spoken conversation) and a new user message, streamed with text and audio
out. Per turn: first audio p50/p90 (request sent -> first audio delta), the prompt's length and
the prompt tokens read from the thinker's prefix cache (`usage.prompt_tokens_details`). Then
the same conversations as text (no talker: the thinker's prefix cache is read): time to first
text token per turn. Prints the last turn's p50 over the first's (target for spoken answers:
<= 1.2x). Every level is warmed up first (one unmeasured conversation per slot).

    python -m benchmarks.http_turns [--config omni_mp/stage_configs/tiny_qwen3_omni.yaml]
        [--conversations 1,8] [--turns 5] [--tokens 48] [--out FILE.json]
    On a GPU (the shipped Qwen3-Omni config, released sizes, random weights):
        bash scripts/gpu/run.sh http_turns --released [--tokens 48] [--frames 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common.served import measure_served, released_qwen3_omni, write_result
from benchmarks.common.stats import percentile_inclusive as pct
from benchmarks.common.warmup import Warmups
from omni_mp.stage_configs import CONFIG_DIR

SYSTEM = "You are a friendly voice assistant. Answer in a few sentences."
VOICE = "ethan"


class Turn:
    """What one turn's streamed answer gave: first audio (or first text), its audio id and usage."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.audio_id: str | None = None
        self.text = ""
        self.prompt_tokens = 0
        self.cached = 0


async def one_turn(
    http: httpx.AsyncClient, url: str, messages: list[dict[str, Any]], spoken: bool, tokens: int
) -> Turn:
    body: dict[str, Any] = {
        "model": "m", "messages": messages, "stream": True, "max_completion_tokens": tokens,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    if spoken:
        body.update(modalities=["text", "audio"], audio={"voice": VOICE, "format": "pcm16"})
    turn, t0 = Turn(), time.perf_counter()
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                turn.prompt_tokens = chunk["usage"]["prompt_tokens"]
                turn.cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            for choice in chunk.get("choices", []):
                delta = choice["delta"]
                audio, text = delta.get("audio") or {}, delta.get("content")
                if spoken and audio.get("data") and turn.first is None:
                    turn.first = time.perf_counter() - t0
                if not spoken and text and turn.first is None:
                    turn.first = time.perf_counter() - t0
                turn.audio_id = audio.get("id") or turn.audio_id
                turn.text += text or ""
    assert turn.first is not None, "no audio" if spoken else "no text"
    return turn


async def conversation(http: httpx.AsyncClient, url: str, k: int, turns: int, spoken: bool, tokens: int) -> list[Turn]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Conversation {k}, question {t}: tell me more about rivers."})
        turn = await one_turn(http, url, messages, spoken, tokens)
        out.append(turn)
        said = {"audio": {"id": turn.audio_id}} if spoken else {"content": turn.text}  # the answer, back
        messages.append({"role": "assistant", **said})
    return out


async def level(http: httpx.AsyncClient, url: str, n: int, args: argparse.Namespace, spoken: bool) -> dict[str, Any]:
    runs = await asyncio.gather(*(conversation(http, url, k, args.turns, spoken, args.tokens) for k in range(n)))
    per_turn = []
    for t in range(args.turns):
        firsts = [1000 * run[t].first for run in runs]  # type: ignore[operator]
        per_turn.append({
            "p50_ms": statistics.median(firsts), "p90_ms": pct(firsts, 90),
            "prompt_tokens": statistics.median(run[t].prompt_tokens for run in runs),
            "cached_tokens": statistics.median(run[t].cached for run in runs),
        })  # fmt: skip
    return {"turns": per_turn, "last_over_first": per_turn[-1]["p50_ms"] / per_turn[0]["p50_ms"]}


def print_level(n: int, kind: str, result: dict[str, Any]) -> None:
    cells = " | ".join(
        f"{t['p50_ms']:7.1f} / {t['p90_ms']:7.1f} ms ({t['prompt_tokens']:.0f} tok, {t['cached_tokens']:.0f} cached)"
        for t in result["turns"]
    )
    print(f"{kind:>6} x{n:<3} | {cells} | last/first {result['last_over_first']:.2f}x", flush=True)


async def bench(args: argparse.Namespace, url: str) -> dict[str, Any]:
    warmups = Warmups("one unmeasured conversation per slot at each level and kind, just before it")
    results: dict[str, Any] = {}
    print("per turn: first audio (spoken) or text token (text), p50 / p90; prompt tokens, cached ones", flush=True)
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=128)) as http:
        for n in args.conversations:
            for kind, spoken in (("spoken", True), ("text", False)):
                t0 = time.time()
                await asyncio.gather(*(conversation(http, url, 10_000 + k, 2, spoken, args.tokens) for k in range(n)))
                warmups.warmed(n, t0, n)
                t_level = time.time()
                results[f"{kind}/{n}"] = result = await level(http, url, n, args, spoken)
                warmups.measured(n, t_level)
                print_level(n, kind, result)
    return {"levels": results, "warmup": warmups.to_json()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG_DIR / "tiny_qwen3_omni.yaml")
    released = "instead of --config: the shipped qwen3_omni.yaml on the released-size checkpoint (GPU)"
    p.add_argument("--released", action="store_true", help=released)
    p.add_argument("--conversations", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--tokens", type=int, default=48, help="thinker tokens per answer")
    p.add_argument("--frames", type=int, default=64, help="--released: codec frames per spoken answer")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "qwen3_omni_gpu")
    p.add_argument("--out", type=Path, help="also write the numbers and the warm-up record to this JSON file")
    p.add_argument("--serving", metavar="URL", help="measure this running server instead of starting one")
    args = p.parse_args()
    if args.released:
        args.config = released_qwen3_omni(args.work_dir, args.tokens, args.frames)
    serving = None if args.serving is None else (args.serving, "")
    result = measure_served(args.config, serving, lambda url, _: bench(args, url))
    write_result(args.out, args.config, args.tokens, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

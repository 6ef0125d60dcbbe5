"""Qwen3-TTS prompt text rows on the CPU at the released width (2048, random weights): the time
a request's T(id) = text_projection(text_embedding(id)) rows take, three ways in one run:

- batched: the request's tokens in one matmul pair (what the prompt builder did before its cache);
- cold: `TtsPromptBuilder.text_rows` with the cache empty at the first of the requests (fixed
  blocks of TEXT_ROWS_BLOCK; later requests find the tokens they share with earlier ones);
- cached: the same requests again (every token seen).

The requests are benchmarks.common.tts_sentences' 20 sentences, tokenized by the tiny Qwen3-TTS
checkpoint's tokenizer (built locally); torch's intra-op threads as the process has them
(`--threads`). The H200 host's breakdown of a request's preparation: docs/qwen3_tts.md.

    python -m benchmarks.tts_prompt_rows [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from benchmarks.common.stats import percentile
from benchmarks.common.tts_sentences import SENTENCES
from omni_mp.models.qwen3_tts import prompt
from omni_mp.models.qwen3_tts.prompt import TtsPromptBuilder, assistant_text
from omni_mp.models.qwen3_tts.tiny import build_named

HIDDEN = 2048


def write_text_tables(out: Path, text_vocab: int, hidden: int = HIDDEN) -> None:
    """What TtsPromptBuilder loads besides a tokenizer, random: the text and codec embeddings,
    the text projection, a config.json with the tts_pad/bos/eos ids (also the test's:
    tests/test_qwen3_tts_prompt_rows.py)."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    save_file(
        {
            prompt.TEXT_EMBED: rand(text_vocab, hidden),
            prompt.CODEC_EMBED: rand(64, hidden),
            "talker.text_projection.linear_fc1.weight": rand(hidden, hidden),
            "talker.text_projection.linear_fc1.bias": rand(hidden),
            "talker.text_projection.linear_fc2.weight": rand(hidden, hidden),
            "talker.text_projection.linear_fc2.bias": rand(hidden),
        },
        str(out / "model.safetensors"),
    )
    config = {"talker_config": {}, "tts_pad_token_id": 1, "tts_bos_token_id": 2, "tts_eos_token_id": 3}
    (out / "config.json").write_text(json.dumps(config))


def released_width_dir(out: Path) -> Path:
    """A dir with the tiny checkpoint's tokenizer and released-width random text tables."""
    tiny = build_named("tiny-qwen3-tts-custom-voice")
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
            shutil.copy(f, out / f.name)
    write_text_tables(out, json.loads((tiny / "config.json").read_text())["talker_config"]["text_vocab_size"])
    return out


def batched(b: TtsPromptBuilder, ids: list[int]) -> torch.Tensor:
    p = b.proj
    x = b.text_embed[torch.tensor(ids, dtype=torch.long)]
    hidden = F.silu(F.linear(x, p["linear_fc1.weight"], p["linear_fc1.bias"]))
    return F.linear(hidden, p["linear_fc2.weight"], p["linear_fc2.bias"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = released_width_dir(Path(tmp))
        b = TtsPromptBuilder(model_dir)
        requests = [b.tokens(assistant_text(s)) for s in SENTENCES]
        batched(b, requests[0])  # first-call costs out of every column
        times: dict[str, list[float]] = {"batched": [], "cold": [], "cached": []}
        for _ in range(args.rounds):
            for ids in requests:
                t0 = time.perf_counter()
                batched(b, ids)
                times["batched"].append(time.perf_counter() - t0)
            fresh = TtsPromptBuilder(model_dir, tokenizer=b.tokenizer)
            for ids in requests:
                t0 = time.perf_counter()
                fresh.text_rows(ids)
                times["cold"].append(time.perf_counter() - t0)
            for ids in requests:
                t0 = time.perf_counter()
                fresh.text_rows(ids)
                times["cached"].append(time.perf_counter() - t0)
    tokens = sum(len(ids) for ids in requests) / len(requests)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s); "
          f"released width {HIDDEN}, {len(requests)} requests of {tokens:.1f} text tokens on average, "
          f"blocks of {prompt.TEXT_ROWS_BLOCK}, {args.rounds} rounds")  # fmt: skip
    print("| rows | ms a request p50 | mean | against batched (mean) |")
    print("|---|---|---|---|")
    base = sum(times["batched"]) / len(times["batched"])
    for name, ts in times.items():
        mean = sum(ts) / len(ts)
        print(f"| {name} | {1000 * percentile(ts, 0.5):.2f} | {1000 * mean:.2f} | {base / mean:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Interim demo: the tiny Qwen2 through one vLLM engine (replaced by the pipeline demo)."""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from omni_mp.models.tiny import resolve_model

    model = resolve_model("tiny-qwen2")
    prompts = sys.argv[1:] or ["Hello world, how are you?"]
    tok = AutoTokenizer.from_pretrained(model)
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0))
    for p, o in zip(prompts, outs, strict=True):
        print(f"{p!r} -> {list(o.outputs[0].token_ids)} {tok.decode(o.outputs[0].token_ids)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

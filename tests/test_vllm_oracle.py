"""vLLM 0.25.0 on the tiny Qwen2 checkpoint generates exactly what transformers generates (fp32, greedy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hf_oracle import assert_same_tokens, greedy, tokenize

PROMPTS = [
    "Hello world, how are you?",
    "The quick brown fox",
    "A thinker writes the reply; a talker turns it into codec tokens.",
    "0 1 2 3",
]
MAX_NEW = 24


@pytest.mark.engine
def test_vllm_greedy_matches_transformers(tiny_qwen2_dir: Path) -> None:
    from vllm import LLM, SamplingParams

    prompt_ids = [tokenize(tiny_qwen2_dir, p) for p in PROMPTS]
    llm = LLM(model=str(tiny_qwen2_dir), dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8, seed=0)
    try:
        outs = llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids],
            SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True),
            use_tqdm=False,
        )
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
    for ids, out in zip(prompt_ids, outs, strict=True):
        got = list(out.outputs[0].token_ids)
        want, margins = greedy(tiny_qwen2_dir, ids, MAX_NEW)
        assert len(got) == MAX_NEW
        assert_same_tokens(got, want, margins, f"prompt {ids}")

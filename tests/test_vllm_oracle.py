"""vLLM 0.25.0 on the tiny Qwen2 checkpoint generates exactly what transformers generates (fp32, greedy)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

PROMPTS = [
    "Hello world, how are you?",
    "The quick brown fox",
    "A thinker writes the reply; a talker turns it into codec tokens.",
    "0 1 2 3",
]
MAX_NEW = 24


def hf_greedy(model_dir: Path, prompt_ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' own generate(): the oracle. Also returns the top-1/top-2 logit margin per step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return out.sequences[0, len(prompt_ids) :].tolist(), margins


@pytest.mark.engine
def test_vllm_greedy_matches_transformers(tiny_qwen2_dir: Path) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(tiny_qwen2_dir)
    prompt_ids = [tok(p).input_ids for p in PROMPTS]
    llm = LLM(
        model=str(tiny_qwen2_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=8,
        seed=0,
    )
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
        want, margins = hf_greedy(tiny_qwen2_dir, ids, MAX_NEW)
        assert len(got) == MAX_NEW
        first_diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, (
            f"prompt {ids}: vLLM {got} != transformers {want}; first difference at step {first_diff}, "
            f"where the transformers top-2 logit margin is {margins[first_diff]:.2e}"
        )

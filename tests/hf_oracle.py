"""The correctness oracle: Hugging Face transformers' own generate() on the same checkpoint."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch


@functools.cache
def _model(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # generate() fills unset fields from the model's generation config, EOS included; the
    # oracle mirrors vLLM's ignore_eos, so the model itself must have no EOS.
    model.generation_config.eos_token_id = None
    return model


def tokenize(model_dir: str | Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(model_dir)(text).input_ids)


def _generate(model_dir: str | Path, prompt_ids: list[int], n: int, **outputs: bool) -> Any:
    """Greedy generate() of exactly `n` tokens (fp32), like vLLM's `ignore_eos`: EOS does not
    stop generation but may still be generated (HF's `min_new_tokens` would instead mask EOS
    out, a different distribution)."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=n, do_sample=False, pad_token_id=0, return_dict_in_generate=True, **outputs)
    ids = torch.tensor([prompt_ids])
    # An explicit mask: otherwise HF masks out every prompt token equal to pad_token_id.
    out = _model(str(model_dir)).generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    assert out.sequences.shape[1] == len(prompt_ids) + n
    return out


def greedy(model_dir: str | Path, prompt_ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """`n` greedy tokens and the top-1/top-2 logit margin at each step."""
    out = _generate(model_dir, prompt_ids, n, output_scores=True)
    margins = [float(v[0] - v[1]) for v in (s[0].topk(2).values for s in out.scores)]
    return out.sequences[0, len(prompt_ids) :].tolist(), margins


def assert_same_tokens(got: list[int], want: list[int], margins: list[float], what: str) -> None:
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert got == want, f"{what}: got {got} != transformers {want}; first difference at step {first}" + (
        f", where the transformers top-2 logit margin is {margins[first]:.2e}" if first is not None else ""
    )


def greedy_hidden(model_dir: str | Path, prompt_ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """`n` greedy tokens and, per `output_hidden_states` index, the hidden states of every
    token the model computed: the prompt and the generated tokens but the last, [L+n-1, H]."""
    out = _generate(model_dir, prompt_ids, n, output_hidden_states=True)
    steps = out.hidden_states  # step 0: prefill [1, L, H] per layer; step j: [1, 1, H] of token j-1
    layers = [torch.cat([step[i][0] for step in steps]) for i in range(len(steps[0]))]
    return out.sequences[0, len(prompt_ids) :].tolist(), layers


def embed_rows(model_dir: str | Path, token_ids: list[int]) -> torch.Tensor:
    return _model(str(model_dir)).get_input_embeddings()(torch.tensor(token_ids)).detach()


@torch.no_grad()
def talker_greedy(
    model_dir: str | Path, prompt_embeds: torch.Tensor, step_embeds: torch.Tensor, n: int
) -> tuple[list[int], list[float]]:
    """The talker, by hand with transformers: prefill on `prompt_embeds`, then decode step k
    feeds embed(code_k) + step_embeds[k] (zeros once those rows are used up)."""
    model = _model(str(model_dir))
    embed = model.get_input_embeddings()
    out = model(inputs_embeds=prompt_embeds[None], use_cache=True)
    codes, margins = [], []
    for k in range(n):
        logits = out.logits[0, -1]
        top = logits.topk(2).values
        margins.append(float(top[0] - top[1]))
        codes.append(int(logits.argmax()))
        if k == n - 1:
            break
        extra = step_embeds[k] if k < step_embeds.shape[0] else torch.zeros(prompt_embeds.shape[1])
        x = embed(torch.tensor([[codes[-1]]])) + extra
        out = model(inputs_embeds=x, past_key_values=out.past_key_values, use_cache=True)
    return codes, margins


@functools.cache
def _omni(model_dir: str) -> Any:
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def token2wav(model_dir: str | Path, codes: list[int], p: Any) -> torch.Tensor:
    """transformers' Qwen2.5-Omni token2wav for DiffusionParams `p`; its noise comes from the
    global RNG, seeded with the request seed (the engine draws the same noise from its own
    generator)."""
    model = _omni(str(model_dir))
    spk = model.speaker_map[p.speaker]
    torch.manual_seed(p.seed)
    with torch.no_grad():
        return model.token2wav(
            torch.tensor([codes]),
            conditioning=spk["cond"].float(),
            reference_mel=spk["ref_mel"].float(),
            num_steps=p.num_steps,
            guidance_scale=p.guidance_scale,
            sway_coefficient=p.sway_coefficient,
        )

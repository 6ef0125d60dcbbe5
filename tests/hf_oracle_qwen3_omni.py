"""The Qwen3-Omni correctness oracle: transformers' own `Qwen3OmniMoeForConditionalGeneration`
(5.17.0) on the same checkpoint, fp32, greedy."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch


@functools.cache
def omni_model(model_dir: str) -> Any:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model


@functools.cache
def _processor(model_dir: str) -> Any:
    from transformers import Qwen3OmniMoeProcessor

    return Qwen3OmniMoeProcessor.from_pretrained(model_dir)


def omni_inputs(model_dir: str | Path, text: str, audio: Any = None, image: Any = None) -> Any:
    """The processor's tensors for `omni_prompt_text(text, ...)` (what the thinker stage sends
    to vLLM); audio: float32 [n] at 16 kHz, image: uint8 [H, W, 3]."""
    from omni_mp.models.qwen3_omni.prompt import omni_prompt_text

    prompt = omni_prompt_text(text, n_audio=int(audio is not None), n_image=int(image is not None))
    return _processor(str(model_dir))(
        text=prompt,
        audio=None if audio is None else [audio],
        images=None if image is None else [image],
        return_tensors="pt",
    )


def _margin(scores: torch.Tensor) -> float:
    top = scores.topk(2).values
    return float(top[0] - top[1])


@dataclasses.dataclass
class ThinkerResult:
    prompt_ids: list[int]
    ids: list[int]  # the reply
    margins: list[float]  # transformers' top-1 minus top-2 logit at each reply step
    # per `output_hidden_states` index (0 = input embeddings): the rows of every token the
    # thinker computed (the prompt and the reply but its last token), [L + n - 1, hidden]
    hidden: list[torch.Tensor]
    embed_table: torch.Tensor  # thinker.model.embed_tokens.weight


@torch.no_grad()
def thinker_generate(
    model_dir: str | Path, text: str, *, audio: Any = None, image: Any = None, n: int
) -> ThinkerResult:
    """Exactly `n` greedy thinker tokens (EOS does not stop it, like vLLM's ignore_eos) with
    the hidden states of every layer."""
    from transformers import GenerationConfig

    model = omni_model(str(model_dir))
    inputs = omni_inputs(model_dir, text, audio, image)
    cfg = GenerationConfig(
        max_new_tokens=n,
        min_new_tokens=0,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_hidden_states=True,
        output_scores=True,
    )
    thinker = model.thinker
    saved = thinker.generation_config
    thinker.generation_config = cfg  # no EOS from the checkpoint's generation config
    try:
        out = thinker.generate(**inputs, generation_config=cfg)
    finally:
        thinker.generation_config = saved
    prompt_len = inputs["input_ids"].shape[1]
    assert out.sequences.shape[1] == prompt_len + n
    layers = len(out.hidden_states[0])
    hidden = [torch.cat([step[k][0] for step in out.hidden_states])[: prompt_len + n - 1] for k in range(layers)]
    return ThinkerResult(
        prompt_ids=inputs["input_ids"][0].tolist(),
        ids=out.sequences[0, prompt_len:].tolist(),
        margins=[_margin(s[0]) for s in out.scores],
        hidden=hidden,
        embed_table=thinker.get_input_embeddings().weight.detach(),
    )

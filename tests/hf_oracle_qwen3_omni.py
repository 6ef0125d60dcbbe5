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


def conversation_inputs(
    model_dir: str | Path, messages: list[dict[str, Any]], audios: list[Any], images: list[Any], tools: Any = None
) -> Any:
    """The processor's tensors for a whole conversation: its chat template
    (`apply_chat_template`, template parts `{"type": "audio"}` / `{"type": "image"}`), then the
    processor on that text with the media in order."""
    proc = _processor(str(model_dir))
    text = proc.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return proc(text=text, audio=audios or None, images=images or None, return_tensors="pt")


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


@dataclasses.dataclass
class OmniResult:
    prompt_ids: list[int]
    thinker_ids: list[int]
    thinker_margins: list[float]
    codes: torch.Tensor  # int64 [frames, 16]: every frame's codes, group 0 first (codec eos frame excluded)
    code_margins: list[float]  # talker (group 0) margins per frame, then the code predictor's per step
    stopped: bool  # the talker ended on codec eos (else on its token limit)
    wav: torch.Tensor  # float32 [samples] at 24 kHz


def _recorder(module: Any, outputs: list[Any]) -> Any:
    """`module.generate` that also returns its scores to us (the caller gets what it asked for)."""
    original = module.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        as_dict = kwargs.get("return_dict_in_generate", False)
        out = original(*args, **{**kwargs, "output_scores": True, "return_dict_in_generate": True})
        outputs.append(out)
        return out if as_dict else out.sequences

    return generate


@torch.no_grad()
def omni_generate(
    model_dir: str | Path,
    text: str,
    *,
    audio: Any = None,
    image: Any = None,
    speaker: str = "Ethan",
    thinker_max_new_tokens: int = 16,
    talker_max_new_tokens: int = 256,
    forced_reply: list[int] | None = None,
    inputs: Any = None,
) -> OmniResult:
    """transformers' whole Qwen3-Omni generate() in fp32: greedy thinker, talker and code
    predictor (the talker's repetition penalty 1.05 and suppressed codec control ids as
    generate() sets them), the thinker stopping on <|im_end|>. `forced_reply`: the thinker's
    reply is exactly these ids (tests.hf_oracle.ForceTokens)."""
    from tests.hf_oracle import forced_thinker

    model = omni_model(str(model_dir))
    inputs = omni_inputs(model_dir, text, audio, image) if inputs is None else inputs  # (a conversation's)
    thinker_kwargs = {"thinker_max_new_tokens": thinker_max_new_tokens}
    thinker_kwargs |= forced_thinker(forced_reply, inputs["input_ids"].shape[1])
    eos = int(model.config.im_end_token_id)
    thinker_out: list[Any] = []
    talker_out: list[Any] = []
    predictor_out: list[Any] = []
    patched = [(model.thinker, thinker_out), (model.talker, talker_out), (model.talker.code_predictor, predictor_out)]
    for module, outs in patched:
        module.generate = _recorder(module, outs)
    try:
        _, wav = model.generate(
            **inputs,
            speaker=speaker,
            **thinker_kwargs,
            thinker_eos_token_id=eos,
            thinker_do_sample=False,
            talker_max_new_tokens=talker_max_new_tokens,
            talker_do_sample=False,
        )
    finally:
        for module, _ in patched:
            del module.generate
    prompt_len = inputs["input_ids"].shape[1]
    (thinker,), (talker,) = thinker_out, talker_out
    codes = torch.stack([h[-1] for h in talker.hidden_states if h[-1] is not None], dim=1)[0]  # [frames, 16]
    ends = int(model.config.talker_config.codec_eos_token_id)
    group0 = talker.sequences[0, -len(talker.scores) :].tolist()
    stopped = ends in group0
    n = group0.index(ends) if stopped else len(group0)
    margins = [_margin(s[0]) for s in talker.scores[:n]]
    margins += [_margin(s[0]) for p in predictor_out[:n] for s in p.scores]
    return OmniResult(
        prompt_ids=inputs["input_ids"][0].tolist(),
        thinker_ids=thinker.sequences[0, prompt_len:].tolist(),
        thinker_margins=[_margin(s[0]) for s in thinker.scores],
        codes=codes[:n].to(torch.int64),
        code_margins=margins,
        stopped=stopped,
        wav=wav.reshape(-1).float(),
    )

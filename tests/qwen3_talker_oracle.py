"""transformers' `Qwen3OmniMoeForConditionalGeneration.generate` (5.17.0) on the tiny Qwen3-Omni
checkpoint, fp32, greedy thinker, talker and code predictor (no repetition penalty), recording
what the talker stage needs to be compared with it: the thinker's outputs as the thinker stage
streams them (omni_mp.models.qwen3_omni.exports), the talker's inputs as generate builds them,
and the 16 codes of every frame."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch


@functools.cache
def omni_model(model_dir: str) -> Any:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


@functools.cache
def omni_processor(model_dir: str) -> Any:
    from transformers import Qwen3OmniMoeProcessor

    return Qwen3OmniMoeProcessor.from_pretrained(model_dir)


@dataclasses.dataclass
class OmniRun:
    prompt_ids: list[int]  # x, media placeholders expanded
    reply_ids: list[int]  # y, as the thinker generated it
    layer_rows: torch.Tensor  # thinker hidden_states[accept_hidden_layer] of x and y[:-1]
    mrope: tuple[torch.Tensor, int]  # the thinker's prompt positions [3, L] and delta
    talker_prompt: torch.Tensor  # [P, hidden]: generate's talker inputs_embeds
    talker_steps: torch.Tensor  # [K, hidden]: trailing_text_hidden
    talker_fill: torch.Tensor  # [hidden]: tts_pad_embed
    codes: torch.Tensor  # [frames, 16]
    talker_tokens: list[int]  # group-0 codes as sampled, the stop code included


@torch.no_grad()
def run_omni(
    model_dir: str,
    text: str,
    *,
    audio: Any = None,
    image: Any = None,
    speaker: str = "Ethan",
    thinker_tokens: int = 12,
    talker_tokens: int = 80,
) -> OmniRun:
    from omni_mp.models.qwen3_omni.prompt import omni_prompt_text

    model = omni_model(model_dir)
    prompt = omni_prompt_text(text, n_audio=int(audio is not None), n_image=int(image is not None))
    inputs = omni_processor(model_dir)(
        text=prompt,
        audio=None if audio is None else [audio],
        images=None if image is None else [image],
        return_tensors="pt",
    )
    captured: dict[str, Any] = {}
    thinker_generate, talker_generate = model.thinker.generate, model.talker.generate

    def thinker(**kw: Any) -> Any:
        captured["thinker"] = out = thinker_generate(**kw)
        return out

    def talker(**kw: Any) -> Any:
        captured["talker_kw"] = kw
        captured["talker"] = out = talker_generate(**kw)
        return out

    model.thinker.generate, model.talker.generate = thinker, talker
    try:
        model.generate(
            **inputs,
            speaker=speaker,
            thinker_max_new_tokens=thinker_tokens,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_repetition_penalty=1.0,
            talker_max_new_tokens=talker_tokens,
        )
    finally:
        del model.thinker.generate, model.talker.generate
    th, kw, tk = captured["thinker"], captured["talker_kw"], captured["talker"]
    x = inputs["input_ids"][0].tolist()
    layer = model.config.talker_config.accept_hidden_layer
    layer_rows = torch.cat([step[layer][0] for step in th.hidden_states])
    rope_kwargs = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw") if k in inputs}
    if "feature_attention_mask" in inputs:
        rope_kwargs["audio_seqlens"] = inputs["feature_attention_mask"].sum(-1)
    ids = inputs["input_ids"]
    pos, delta = model.thinker.get_rope_index(ids, attention_mask=torch.ones_like(ids), **rope_kwargs)
    codes = torch.stack([h[-1] for h in tk.hidden_states if h[-1] is not None], dim=1)[0]
    return OmniRun(
        prompt_ids=x,
        reply_ids=th.sequences[0, len(x) :].tolist(),
        layer_rows=layer_rows,
        mrope=(pos[:, 0], int(delta[0, 0])),
        talker_prompt=kw["inputs_embeds"][0],
        talker_steps=kw["trailing_text_hidden"][0],
        talker_fill=kw["tts_pad_embed"][0, 0],
        codes=codes,
        talker_tokens=tk.sequences[0].tolist(),
    )

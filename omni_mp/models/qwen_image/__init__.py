"""Qwen-Image (text encoder -> DiT): everything omni_mp knows of this family.

- `params`: `ImageParams`, what a client asks of one image (passed in `Submit.params`).
- `prompt`: the encoder's prompt template (`prompt_format: qwen_image`; the negative prompt
  runs as a companion sequence of the same request).
- `text_view`: the encoder of a diffusers-layout checkpoint as vLLM's Qwen2.5-VL, language
  model only (`model_part: qwen_image_text`).
- `processor`: encoder rows -> DiT conditioning, template dropped (`processor: qwen_image_dit`).
- `schedule`, `dit`: the flow-match grid and the DiT + VAE as a diffusion-engine model
  (`diffusion.model_type: qwen_image`).
- `tiny`: the tiny checkpoint of the tests (`model: tiny-qwen-image`); imported only through
  the registry's built-in names.

This module only declares names (omni_mp.models.registry reads them); each is imported when a
stage asks for it.
"""

from typing import Any

from omni_mp.models.family import Family, Processor


def _prompt_format() -> Any:
    from omni_mp.models.qwen_image.prompt import PROMPT_FORMAT

    return PROMPT_FORMAT


def _text() -> Any:
    from omni_mp.models.qwen_image.text_view import text_engine_model

    return text_engine_model


def _processor() -> Any:
    from omni_mp.models.qwen_image.processor import QwenImageDiTInputs

    return QwenImageDiTInputs


def _dit() -> Any:
    from omni_mp.models.qwen_image.dit import QwenImageModel

    return QwenImageModel.from_checkpoint


def _tiny() -> Any:
    from omni_mp.models.qwen_image.tiny import build_named

    return build_named


FAMILY = Family(
    name="qwen_image",
    processors={"qwen_image_dit": Processor(_processor, needs_hidden_states=True, feeds_diffusion=True)},
    prompt_formats={"qwen_image": _prompt_format},
    model_parts={"qwen_image_text": _text},
    diffusion_models={"qwen_image": _dit},
    image_models=frozenset({"qwen_image"}),  # its diffusion model makes images (HTTP, CLI)
    builtin_models={"tiny-qwen-image": _tiny},
)

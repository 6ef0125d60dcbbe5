"""The diffusers oracle of the Qwen-Image family: `QwenImagePipeline` (diffusers 0.42.1) on the
same checkpoint, run with a request's ImageParams and seed (fp32 on the CPU in the tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_mp.models.qwen_image.params import ImageParams


def diffusers_image(pipe: Any, prompt: str, p: ImageParams, on_step: Callable[..., Any] | None = None) -> torch.Tensor:
    """diffusers' image of `prompt` with `p` (float [H, W, 3] in [0, 1]); `on_step`: its
    `callback_on_step_end`."""
    out = pipe(
        prompt,
        negative_prompt=p.negative_prompt,
        true_cfg_scale=p.true_cfg_scale,
        height=p.height,
        width=p.width,
        num_inference_steps=p.num_inference_steps,
        generator=torch.Generator().manual_seed(p.seed),  # type: ignore[arg-type]
        output_type="np",
        callback_on_step_end=on_step,
    )
    return torch.from_numpy(out.images[0])

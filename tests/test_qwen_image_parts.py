"""Qwen-Image's DiT run a few blocks at a time (`dit_parts.forward_in_parts`, what lets a
denoising step pause for a new request) against diffusers' own `forward` of the same module:
bit for bit (CPU, fp32, same inputs), with and without a text key-padding mask."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from omni_mp.models.qwen_image.dit_parts import forward_in_parts, parts_per_call
from omni_mp.models.registry import resolve_model


@pytest.fixture(scope="module")
def transformer() -> Any:
    from diffusers import QwenImageTransformer2DModel

    ckpt = Path(resolve_model("tiny-qwen-image"))
    return QwenImageTransformer2DModel.from_pretrained(ckpt / "transformer", dtype=torch.float32).eval()


def inputs(tr: Any, masked: bool) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    rows, h, w, text = 3, 4, 6, 7
    mask = None
    if masked:  # rows of 7, 5 and 2 valid text tokens, right-padded
        mask = torch.arange(text)[None] < torch.tensor([7, 5, 2])[:, None]
    return {
        "hidden_states": torch.randn(rows, h * w, tr.config.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(rows, text, tr.config.joint_attention_dim, generator=gen),
        "encoder_hidden_states_mask": mask,
        "timestep": torch.tensor([0.9, 0.5, 0.1]),
        "img_shapes": [[(1, h, w)]] * rows,
    }


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("blocks_per_part", [0, 1, 2])
@torch.no_grad()
def test_parts_equal_the_modules_forward(transformer: Any, masked: bool, blocks_per_part: int) -> None:
    args = inputs(transformer, masked)
    want = transformer(**args, return_dict=False)[0]
    parts = forward_in_parts(transformer, **args, blocks_per_part=blocks_per_part)
    pauses = 0
    while True:
        try:
            next(parts)
            pauses += 1
        except StopIteration as stop:
            got = stop.value
            break
    blocks = len(transformer.transformer_blocks)
    assert blocks >= 2  # the tiny DiT has blocks to pause between
    assert pauses == parts_per_call(transformer, blocks_per_part) - 1
    assert pauses == (0 if blocks_per_part == 0 else -(-blocks // blocks_per_part) - 1)
    assert torch.equal(got, want)

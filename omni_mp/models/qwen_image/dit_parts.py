"""Qwen-Image's DiT forward run a few blocks at a time, so a denoising step can pause between
blocks and let the engine take in a request that arrived meanwhile.

diffusers 0.42.1's `QwenImageTransformer2DModel.forward` is one call over its 60 blocks.
`forward_in_parts` runs the same submodules in the same order with the same arguments
(input projections, the timestep embedding, the text mask and rotary tables, the blocks,
the output norm and projection) as a generator that yields after every `blocks_per_part`
blocks: the result is bit for bit the module's own forward (tests/test_qwen_image_parts.py).
It reads the module's attributes and the block call signature of that diffusers version
(pinned in pyproject.toml), which is why it lives here, in the family, and nowhere else.

Variants this path does not know (Qwen-Image-Edit's `zero_cond_t`, an additional timestep
condition, guidance embeddings) run the module's own forward in one part.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import torch


def supports_parts(transformer: Any) -> bool:
    c = transformer.config
    return not (c.zero_cond_t or c.use_additional_t_cond or c.guidance_embeds)


def parts_per_call(transformer: Any, blocks_per_part: int) -> int:
    """How many parts one `forward_in_parts` call runs in (it yields one fewer times)."""
    blocks = len(transformer.transformer_blocks)
    if blocks_per_part <= 0 or not supports_parts(transformer):
        return 1
    return max(1, math.ceil(blocks / blocks_per_part))


def forward_in_parts(
    transformer: Any,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    encoder_hidden_states_mask: torch.Tensor | None,
    timestep: torch.Tensor,
    img_shapes: list[list[tuple[int, int, int]]],
    blocks_per_part: int,
) -> Generator[None, None, torch.Tensor]:
    """The transformer's output for these inputs (its `forward(..., return_dict=False)[0]`),
    yielding between parts of `blocks_per_part` blocks (0: one part)."""
    tr = transformer
    if parts_per_call(tr, blocks_per_part) == 1:
        # forward(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, timestep, img_shapes)
        args = (hidden_states, encoder_hidden_states, encoder_hidden_states_mask, timestep, img_shapes)
        return tr(*args, return_dict=False)[0]
    from diffusers.models.transformers.transformer_qwenimage import compute_text_seq_len_from_mask

    hidden = tr.img_in(hidden_states)
    timestep = timestep.to(hidden.dtype)
    text = tr.txt_in(tr.txt_norm(encoder_hidden_states))
    text_len, _, mask = compute_text_seq_len_from_mask(text, encoder_hidden_states_mask)
    temb = tr.time_text_embed(timestep, hidden, None)
    rope = tr.pos_embed(img_shapes, max_txt_seq_len=text_len, device=hidden.device)
    for i, block in enumerate(tr.transformer_blocks):
        if i and i % blocks_per_part == 0:
            yield
        text, hidden = block(
            hidden_states=hidden,
            encoder_hidden_states=text,
            encoder_hidden_states_mask=mask,
            temb=temb,
            image_rotary_emb=rope,
            joint_attention_kwargs=None,
            modulate_index=None,
        )
    return tr.proj_out(tr.norm_out(hidden, temb))

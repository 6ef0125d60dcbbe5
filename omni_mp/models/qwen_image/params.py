"""What a client asks of one Qwen-Image request (no torch import: clients and config use it).

A client passes them in `Submit.params` as a plain map, e.g.
`msgspec.to_builtins(ImageParams(height=512, width=768, seed=7))`, with the text prompt in
`Submit.prompt`; every stage of the request receives the same map (`StageRequest.params`).
The text-encoder stage reads `negative_prompt` and `true_cfg_scale` (whether to encode the
negative prompt), the DiT stage reads them all. Unknown keys and out-of-range values fail the
request before any model work. Defaults are diffusers' `QwenImagePipeline` defaults; a size the request
leaves out is 1024, capped at the DiT stage's `max_height`/`max_width`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

# Pixels per side must be a multiple of this: 8x VAE downscale times the 2x2 latent packing.
SIZE_MULTIPLE = 16


class ImageParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    height: Annotated[int, Meta(ge=SIZE_MULTIPLE, le=16384)] = 1024  # pixels, a multiple of 16
    width: Annotated[int, Meta(ge=SIZE_MULTIPLE, le=16384)] = 1024
    num_inference_steps: Annotated[int, Meta(ge=1, le=1000)] = 50
    # True CFG (two transformer passes per step) runs when > 1 and a negative prompt is given
    # (" " is a valid negative prompt), as in diffusers.
    true_cfg_scale: Annotated[float, Meta(ge=0.0, le=100.0)] = 4.0
    negative_prompt: Annotated[str, Meta(max_length=65536)] | None = None
    seed: int | None = None  # None: a random seed, drawn when the DiT stage starts the request
    # Prompt tokens the DiT sees (after the template's drop); diffusers' default, 1024 at most.
    max_sequence_length: Annotated[int, Meta(ge=1, le=1024)] = 512
    # Emit a preview every k steps (the current latents decoded; chunk key `image_step`: the
    # steps done); 0: none. The final image is the request's last chunk.
    preview_every: Annotated[int, Meta(ge=0, le=1000)] = 0

    @property
    def cfg(self) -> bool:
        """Whether this request runs true CFG (and so encodes its negative prompt)."""
        return self.true_cfg_scale > 1.0 and self.negative_prompt is not None


def parse_params(raw: dict | None) -> ImageParams:
    """`Submit.params` -> ImageParams; ValueError naming what is wrong (size multiple included)."""
    try:
        params = msgspec.convert(raw or {}, ImageParams)
    except msgspec.ValidationError as err:
        raise ValueError(f"image params: {err}") from None
    for name in ("height", "width"):
        if getattr(params, name) % SIZE_MULTIPLE:
            raise ValueError(f"image params: {name} {getattr(params, name)} is not a multiple of {SIZE_MULTIPLE}")
    return params

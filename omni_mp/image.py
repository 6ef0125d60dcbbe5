"""Image outputs: how a stage's images travel.

A stage that produces images (the diffusion kind serving an image model) puts a request's
image in its output chunk's AdditionalInformation as `image` (uint8 [height, width, 3], RGB).
A preview decoded part-way through the denoising also carries `image_step` (the steps done);
the final image has no `image_step`. The coordinator keeps a final stage's final image as
`StageResult.image` (`FinalImage`; bounded by `Limits.max_tensor_bytes`); a streaming client
sees previews and the final image as they come.
"""

from __future__ import annotations

import torch

from omni_mp.wire.messages import IMAGE_KEY, IMAGE_STEP_KEY


def image_info(pixels: torch.Tensor, *, preview_step: int | None = None) -> dict[str, torch.Tensor | int]:
    """AdditionalInformation of an image chunk: pixels uint8 [H, W, 3]."""
    if pixels.dtype != torch.uint8 or pixels.ndim != 3 or pixels.shape[-1] != 3:
        raise ValueError(f"image: expected uint8 [H, W, 3], got {pixels.dtype} {tuple(pixels.shape)}")
    info: dict[str, torch.Tensor | int] = {IMAGE_KEY: pixels.contiguous()}
    if preview_step is not None:
        info[IMAGE_STEP_KEY] = preview_step
    return info


def chunk_image(info: dict | None) -> tuple[torch.Tensor, int | None] | None:
    """(pixels, preview step or None) of a chunk's AdditionalInformation, None if it has no
    image; ValueError if the entries are malformed."""
    if not info or IMAGE_KEY not in info:
        return None
    pixels, step = info[IMAGE_KEY], info.get(IMAGE_STEP_KEY)
    if not isinstance(pixels, torch.Tensor) or pixels.dtype != torch.uint8 or pixels.ndim != 3 or pixels.shape[-1] != 3:
        raise ValueError(f"image: expected uint8 [H, W, 3], got {getattr(pixels, 'shape', type(pixels))}")
    if step is not None and (not isinstance(step, int) or step < 0):
        raise ValueError(f"image_step: expected a non-negative int, got {step!r}")
    return pixels, step


class FinalImage:
    """The final image of a request from one stage: at most one, bounded in bytes. Previews
    are checked and passed over (streaming clients see them as chunks)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pixels: torch.Tensor | None = None

    def add(self, info: dict | None) -> None:
        got = chunk_image(info)
        if got is None or got[1] is not None:
            return
        pixels = got[0]
        if pixels.numel() > self.max_bytes:
            raise ValueError(f"image output of {pixels.numel()} bytes exceeds max_tensor_bytes ({self.max_bytes})")
        if self.pixels is not None:
            raise ValueError("a second final image for one request (an image stage makes one per request)")
        self.pixels = pixels.clone()  # the received tensor is a view of the message buffer

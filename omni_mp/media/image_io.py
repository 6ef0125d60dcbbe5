"""Image outputs as files: uint8 [height, width, 3] RGB pixels -> PNG (Pillow). No torch import:
the CLI and the HTTP server use it on what the client returns (numpy arrays)."""

from __future__ import annotations

import io
import re
import secrets
from pathlib import Path
from typing import Any

import numpy as np

MAX_SIDE = 16384  # pixels per side a client passes on (the stage applies its model's own bounds)
_SIZE = re.compile(r"(\d{1,6})x(\d{1,6})")


def rgb_array(pixels: Any, what: str = "image") -> np.ndarray:
    """`pixels` (a numpy array or a CPU torch tensor: its memory shared) as numpy uint8
    [height, width, 3]; ValueError naming `what` otherwise."""
    array = np.asarray(pixels.numpy() if hasattr(pixels, "numpy") else pixels)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3 or 0 in array.shape:
        raise ValueError(f"{what}: want a non-empty uint8 [height, width, 3] array, not {array.dtype} {array.shape}")
    return array


def png_bytes(pixels: Any) -> bytes:
    """The image as a PNG file's bytes (lossless: decoding gives the same pixels back)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb_array(pixels))).save(out, format="PNG")
    return out.getvalue()


def write_png(path: Path, pixels: Any) -> None:
    path.write_bytes(png_bytes(pixels))


def parse_size(size: str) -> tuple[int, int]:
    """'WIDTHxHEIGHT' -> (width, height); ValueError naming what is wrong."""
    m = _SIZE.fullmatch(size)
    if m is None:
        raise ValueError(f"size {size!r}: expected WIDTHxHEIGHT, e.g. 1024x1024")
    width, height = int(m.group(1)), int(m.group(2))
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"size {size!r}: each side must be 1 to {MAX_SIDE} pixels")
    return width, height


def draw_seed() -> int:
    """A random seed for a request that names none: drawn by the client, so that the answer can
    say which seed made the image (seeds + i for n images stay below 2**31)."""
    return secrets.randbelow(2**31 - 1024)

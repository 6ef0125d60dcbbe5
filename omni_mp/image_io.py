"""Image outputs as files: uint8 [height, width, 3] RGB pixels -> PNG (Pillow). No torch import:
the CLI and the HTTP server use it on what the client returns (numpy arrays)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np


def _rgb(pixels: Any) -> np.ndarray:
    array = np.asarray(pixels.numpy() if hasattr(pixels, "numpy") else pixels)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3 or 0 in array.shape:
        raise ValueError(f"image: expected a non-empty uint8 [height, width, 3] array, got {array.dtype} {array.shape}")
    return np.ascontiguousarray(array)


def png_bytes(pixels: Any) -> bytes:
    """The image as a PNG file's bytes (lossless: decoding gives the same pixels back)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(_rgb(pixels)).save(out, format="PNG")
    return out.getvalue()


def write_png(path: Path, pixels: Any) -> None:
    path.write_bytes(png_bytes(pixels))

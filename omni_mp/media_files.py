"""Media files a client sends (audio and images), read into what `Submit.multi_modal` carries.

Torch-free (the client imports it): arrays stay numpy, tensors stay torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from omni_mp.audio_io import read_audio
from omni_mp.wire.messages import AudioInput, ImageInput, MultiModalInput
from omni_mp.wire.tensor_codec import NUMPY_ARRAYS, array_codec

if TYPE_CHECKING:
    import torch

# (Strings: torch is named for type checkers only.)
AudioLike: TypeAlias = "str | Path | tuple[torch.Tensor | np.ndarray, int]"  # an audio file, or (samples, rate)
ImageLike: TypeAlias = "str | Path | torch.Tensor | np.ndarray"  # an image file (PNG, JPEG, ...), or uint8 [H, W, 3]


def read_image(path: str | Path) -> np.ndarray:
    """An image file as uint8 [height, width, 3] RGB."""
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()


def _samples(samples: Any) -> Any:
    """Mono float32 samples: a torch tensor stays one, anything else becomes a numpy array."""
    if array_codec(samples) not in (None, NUMPY_ARRAYS):
        return samples.float().reshape(-1)
    return np.asarray(samples, dtype=np.float32).reshape(-1)


def multi_modal_input(audios: Sequence[AudioLike] = (), images: Sequence[ImageLike] = ()) -> MultiModalInput | None:
    out = MultiModalInput()
    for a in audios:
        samples, rate = read_audio(a) if isinstance(a, str | Path) else a
        out.audios.append(AudioInput(samples=_samples(samples), sample_rate=rate))
    for im in images:
        pixels = read_image(im) if isinstance(im, str | Path) else im
        if array_codec(pixels) is None:
            pixels = np.asarray(pixels)
        out.images.append(ImageInput(pixels=pixels))
    return out if out.audios or out.images else None

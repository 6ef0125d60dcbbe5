"""Media files a client sends (audio and images), read into what `Submit.multi_modal` carries."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from omni_mp.audio_io import read_audio
from omni_mp.wire.payload import AudioInput, ImageInput, MultiModalInput

AudioLike = str | Path | tuple[torch.Tensor | np.ndarray, int]  # an audio file (WAV, FLAC, ...), or (samples, rate)
ImageLike = str | Path | torch.Tensor | np.ndarray  # an image file (PNG, JPEG, ...), or uint8 [H, W, 3]


def read_image(path: str | Path) -> torch.Tensor:
    """An image file as uint8 [height, width, 3] RGB."""
    from PIL import Image

    with Image.open(path) as img:
        return torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.uint8).copy())


def multi_modal_input(audios: Sequence[AudioLike] = (), images: Sequence[ImageLike] = ()) -> MultiModalInput | None:
    out = MultiModalInput()
    for a in audios:
        samples, rate = read_audio(a) if isinstance(a, str | Path) else a
        out.audios.append(
            AudioInput(samples=torch.as_tensor(samples, dtype=torch.float32).reshape(-1), sample_rate=rate)
        )
    for im in images:
        pixels = read_image(im) if isinstance(im, str | Path) else torch.as_tensor(im)
        out.images.append(ImageInput(pixels=pixels))
    return out if out.audios or out.images else None

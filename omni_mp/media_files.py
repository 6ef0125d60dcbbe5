"""Media files a client sends (audio and images), read into what `Submit.multi_modal` carries.

Torch-free (the client imports it): arrays stay numpy, tensors stay torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from omni_mp.audio_io import check_rate, read_audio
from omni_mp.wire.messages import AudioInput, ImageInput, MultiModalInput
from omni_mp.wire.tensor_codec import NUMPY_ARRAYS, array_codec

if TYPE_CHECKING:
    import torch

# (Strings: torch is named for type checkers only.)
AudioLike: TypeAlias = "str | Path | tuple[torch.Tensor | np.ndarray, int]"  # an audio file, or (samples, rate)
ImageLike: TypeAlias = "str | Path | torch.Tensor | np.ndarray"  # an image file (PNG, JPEG, ...), or uint8 [H, W, 3]


# What read_image decodes at most: the largest image a stage config may take (MediaLimits'
# bound on max_image_pixels). The size is read from the header, before anything is decoded.
MAX_READ_PIXELS = 2**28
# [frames, channels] arrays: at most this many channels (libsndfile's own bound); a wider one
# is most likely [channels, frames].
MAX_CHANNELS = 1024


class ImageFileError(ValueError):
    """An image file that cannot be used; the message names the file and why."""


def read_image(path: str | Path, max_pixels: int = MAX_READ_PIXELS) -> np.ndarray:
    """An image file as uint8 [height, width, 3] RGB. One that declares more than `max_pixels`
    pixels is refused from its header, before it is decoded (a decompression bomb costs
    nothing); a cut or unreadable file is an ImageFileError naming it."""
    from PIL import Image

    p = Path(path)
    try:
        with Image.open(p) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise ImageFileError(f"{p}: {width}x{height} pixels; at most {max_pixels} are read")
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except Image.DecompressionBombError:  # PIL's own bound, checked as it opens the file
        raise ImageFileError(f"{p}: its header declares over {2 * Image.MAX_IMAGE_PIXELS} pixels") from None
    except (OSError, SyntaxError, ValueError) as err:  # cut, unknown or corrupt (PIL's errors)
        if isinstance(err, ImageFileError):
            raise
        raise ImageFileError(f"{p}: not a readable image ({err})") from None


def _samples(samples: Any, where: str) -> Any:
    """Mono float32 samples: a torch tensor stays one, anything else becomes a numpy array. A
    [frames, channels] array is down-mixed as audio files are (the mean of the channels)."""
    if array_codec(samples) not in (None, NUMPY_ARRAYS):
        samples = samples.float()
    else:
        samples = np.asarray(samples, dtype=np.float32)
    shape = tuple(samples.shape)
    if len(shape) == 2 and 1 <= shape[1] <= MAX_CHANNELS:
        samples = samples.mean(1) if shape[1] > 1 else samples[:, 0]
    elif len(shape) != 1:
        raise ValueError(
            f"{where}: expected mono [samples] or [frames, channels] (at most {MAX_CHANNELS} channels), "
            f"got shape {list(shape)}; a [channels, frames] array needs transposing"
        )
    if samples.shape[0] == 0:
        raise ValueError(f"{where}: no audio samples")
    return samples


def multi_modal_input(audios: Sequence[AudioLike] = (), images: Sequence[ImageLike] = ()) -> MultiModalInput | None:
    """Files are read here (ValueErrors naming the file); arrays are checked for their layout
    and sample rate. Sizes and values are the pipeline's to check (the coordinator and the
    entry stage, against the model's limits)."""
    out = MultiModalInput()
    for i, a in enumerate(audios):
        samples, rate = read_audio(a) if isinstance(a, str | Path) else a
        check_rate(rate, f"audios[{i}]")
        out.audios.append(AudioInput(samples=_samples(samples, f"audios[{i}]"), sample_rate=rate))
    for im in images:
        pixels = read_image(im) if isinstance(im, str | Path) else im
        if array_codec(pixels) is None:
            pixels = np.asarray(pixels)
        out.images.append(ImageInput(pixels=pixels))
    return out if out.audios or out.images else None

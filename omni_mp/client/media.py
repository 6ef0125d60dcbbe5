"""Media a client sends (audio and images), checked and read into what `Submit.multi_modal`
carries. Every bad argument is a `ValueError` naming it (`audios[0]`, `images[1]`) and, for
a file, the file.

Audio arrays: 1-D [samples] is mono; 2-D [samples, channels] with 1..8 channels (and more
samples than channels) is down-mixed to mono by the mean of its channels, as audio files
are (`audio_io.downmix`). Anything else is refused with its shape, never reshaped: a
channels-first [channels, samples] array (torchaudio's layout) is told to pass `.T`.

Torch-free (the client imports it): audio becomes float32 numpy, images stay what they are."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from omni_mp.media.audio_io import MAX_RATE, MIN_RATE, AudioFileError, downmix, read_audio
from omni_mp.wire.messages import AudioInput, ImageInput, MultiModalInput
from omni_mp.wire.tensor_codec import array_codec

if TYPE_CHECKING:
    import torch

# (Strings: torch is named for type checkers only.)
AudioLike: TypeAlias = "str | Path | tuple[torch.Tensor | np.ndarray, int]"  # an audio file, or (samples, rate)
ImageLike: TypeAlias = "str | Path | torch.Tensor | np.ndarray"  # an image file (PNG, JPEG, ...), or uint8 [H, W, 3]

# The most channels a [samples, channels] array may have (7.1 surround).
MAX_CHANNELS = 8
# What read_image decodes at most: the largest image a stage config may take (MediaLimits'
# bound on max_image_pixels).
MAX_READ_PIXELS = 2**28


def read_image(path: str | Path, max_pixels: int = MAX_READ_PIXELS) -> np.ndarray:
    """An image file as uint8 [height, width, 3] RGB; ValueError naming the file if it is not
    one. One that declares more than `max_pixels` pixels is refused from its header, before
    it is decoded: a decompression bomb costs nothing."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    try:
        with Image.open(p) as img:
            width, height = img.size
            if width * height <= max_pixels:
                return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except Image.DecompressionBombError:  # PIL's own bound, checked as it opens the file
        raise ValueError(f"{p}: its header declares over {2 * Image.MAX_IMAGE_PIXELS} pixels") from None
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"{p}: not a readable image ({err})") from None
    raise ValueError(f"{p}: {width}x{height} pixels; at most {max_pixels} are read")


def _float_array(samples: Any, what: str) -> np.ndarray:
    if hasattr(samples, "detach"):  # a torch tensor, without importing torch
        samples = samples.detach().cpu().float().numpy()
    try:
        return np.asarray(samples, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what}: samples must be an array of numbers ({err})") from None


def audio_samples(samples: Any, what: str) -> np.ndarray:
    """Mono float32 samples by the module's rule; ValueError naming `what` otherwise."""
    data = _float_array(samples, what)
    shape = list(data.shape)
    if data.ndim == 2 and data.shape[1] <= MAX_CHANNELS < data.shape[0]:
        data = downmix(data)
    elif data.ndim == 2 and data.shape[0] <= MAX_CHANNELS < data.shape[1]:
        raise ValueError(
            f"{what}: shape {shape} looks like [channels, samples]; pass [samples, channels] (`samples.T`) "
            "to have it down-mixed, or mono [samples]"
        )
    elif data.ndim != 1:
        raise ValueError(
            f"{what}: expected mono [samples] or [samples, channels] with at most {MAX_CHANNELS} channels, "
            f"got shape {shape}"
        )
    if data.size == 0:
        raise ValueError(f"{what}: no audio samples")
    if not np.isfinite(data).all():
        raise ValueError(f"{what}: samples must be finite (NaN or infinity found)")
    return np.ascontiguousarray(data)


def _audio(item: Any, what: str) -> AudioInput:
    if isinstance(item, str | Path):
        try:
            samples, rate = read_audio(item)
        except AudioFileError as err:
            raise AudioFileError(f"{what}: {err}") from None
        return AudioInput(samples=samples, sample_rate=rate)
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise ValueError(f"{what}: expected an audio file or a (samples, sample_rate) pair, got {type(item).__name__}")
    samples, rate = item
    if isinstance(rate, bool) or not isinstance(rate, int | np.integer) or not MIN_RATE <= rate <= MAX_RATE:
        raise ValueError(f"{what}: sample rate must be an int in {MIN_RATE}..{MAX_RATE} Hz, got {rate!r}")
    return AudioInput(samples=audio_samples(samples, what), sample_rate=int(rate))


def _image(item: Any, what: str) -> ImageInput:
    if isinstance(item, str | Path):
        try:
            return ImageInput(pixels=read_image(item))
        except ValueError as err:
            raise ValueError(f"{what}: {err}") from None
    try:
        pixels = item if array_codec(item) is not None else np.asarray(item)
    except ValueError as err:  # e.g. a ragged list
        raise ValueError(f"{what}: not an array ({err})") from None
    codec = array_codec(pixels)
    assert codec is not None
    dtype, shape, _ = codec.header(pixels, what)  # (a PayloadError, a ValueError naming `what`, if unsupported)
    if dtype != "uint8" or len(shape) != 3 or shape[2] != 3 or 0 in shape:
        raise ValueError(
            f"{what}: expected uint8 [height, width, 3] RGB (or an image file), got {dtype} of shape {list(shape)}"
        )
    return ImageInput(pixels=pixels)


def _items(name: str, items: Any) -> Sequence[Any]:
    if isinstance(items, str | bytes | Path) or not isinstance(items, Sequence):
        raise ValueError(f"`{name}` must be a list (of files or arrays), got {type(items).__name__}")
    return items


def multi_modal_input(audios: Sequence[AudioLike] = (), images: Sequence[ImageLike] = ()) -> MultiModalInput | None:
    out = MultiModalInput()
    out.audios = [_audio(a, f"audios[{i}]") for i, a in enumerate(_items("audios", audios))]
    out.images = [_image(im, f"images[{i}]") for i, im in enumerate(_items("images", images))]
    return out if out.audios or out.images else None

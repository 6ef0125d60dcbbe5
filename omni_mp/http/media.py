"""Media in a chat request: `input_audio` (raw base64 or a data: URL; any format libsndfile
reads: wav, mp3, flac, ...) and `image_url` data: URLs. Sizes are checked before anything
is decoded: the base64 text's length, then the decoded file's header (duration, pixels);
the server fetches nothing, so a remote URL is refused."""

from __future__ import annotations

import base64
import binascii
import io
import re

import msgspec
import numpy as np
import soundfile

from omni_mp.config.schema import MediaLimits
from omni_mp.http.errors import bad_request, too_large
from omni_mp.media.audio_io import MAX_RATE, MIN_RATE, downmix

AUDIO_FORMATS = frozenset({"wav", "mp3", "flac", "ogg"})
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+=[\w.+-]+)*;base64,", re.IGNORECASE)


class MediaSizes(msgspec.Struct, frozen=True):
    max_media_bytes: int  # one decoded file (audio or image)


def b64_payload(data: str, max_bytes: int, param: str) -> bytes:
    """The bytes of raw base64 or a data: URL, refused by its length before decoding."""
    m = _DATA_URL.match(data[:256])
    body = data[m.end() :] if m else data
    if len(body) // 4 * 3 > max_bytes:
        raise too_large(param, len(body) // 4 * 3, max_bytes)
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("not valid base64 (nor a base64 data: URL)", param) from None


def decode_audio(data: str, fmt: str, sizes: MediaSizes, limits: MediaLimits, param: str) -> tuple[np.ndarray, int]:
    """Mono float32 samples and their rate; 400 naming `param` for anything unusable."""
    if fmt.lower() not in AUDIO_FORMATS:
        raise bad_request(
            f"audio format {fmt!r} is not supported; use one of {sorted(AUDIO_FORMATS)}", f"{param}.format"
        )
    raw = b64_payload(data, sizes.max_media_bytes, f"{param}.data")
    try:
        with soundfile.SoundFile(io.BytesIO(raw)) as f:
            seconds = f.frames / f.samplerate if f.samplerate else 0.0
            if seconds > limits.max_audio_s:
                raise bad_request(f"audio of {seconds:.1f}s > max_audio_s={limits.max_audio_s}", f"{param}.data")
            if not MIN_RATE <= f.samplerate <= MAX_RATE:
                raise bad_request(f"sample rate {f.samplerate} Hz outside {MIN_RATE}..{MAX_RATE} Hz", f"{param}.data")
            frames, rate = f.read(dtype="float32", always_2d=True), f.samplerate
    except soundfile.SoundFileError as err:
        raise bad_request(f"not a readable audio file ({err})", f"{param}.data") from None
    if frames.shape[0] == 0:
        raise bad_request("the audio has no samples", f"{param}.data")
    return downmix(frames), rate


def decode_image(url: str, sizes: MediaSizes, limits: MediaLimits, param: str) -> np.ndarray:
    """uint8 [H, W, 3] RGB of a data: URL; remote URLs are refused (nothing is fetched)."""
    from PIL import Image, UnidentifiedImageError

    if not url[:5].lower() == "data:":
        raise bad_request("only data: URLs are accepted (this server fetches nothing)", param, "unsupported_url")
    raw = b64_payload(url, sizes.max_media_bytes, param)
    try:
        with Image.open(io.BytesIO(raw)) as img:  # reads the header only
            w, h = img.size
            if w * h > limits.max_image_pixels:
                raise bad_request(f"{w}x{h} pixels > max_image_pixels={limits.max_image_pixels}", param)
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except (UnidentifiedImageError, OSError) as err:
        raise bad_request(f"not a readable image ({err})", param) from None

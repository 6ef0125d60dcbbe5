"""Audio and image outputs: the one convention by which a stage's chunks carry them, and the one
parser of it (the coordinator, the client, the HTTP server and the benchmarks all read it here).

- Audio: a stage that speaks puts each step's new samples of a request in its chunk's
  AdditionalInformation as `audio` (float32 [n], in [-1, 1]) with `sample_rate`. The coordinator
  joins a final stage's chunks into `StageResult.audio` (`AudioParts`, bounded by
  `Limits.max_tensor_bytes`); a streaming client sees each chunk as it comes (`chunk_audio`).
- Images: a stage that draws puts a request's image there as `image` (uint8 [height, width, 3],
  RGB). A preview decoded part-way through the denoising also carries `image_step` (the steps
  done); the final image has none. The coordinator keeps a final stage's final image as
  `StageResult.image` (`FinalImage`); a streaming client sees previews and the final image.

The parsers take numpy arrays and torch tensors alike and import no torch (the client must not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from omni_mp.media.image_io import rgb_array
from omni_mp.wire.messages import AUDIO_KEY, IMAGE_KEY, IMAGE_STEP_KEY, SAMPLE_RATE_KEY
from omni_mp.wire.tensor_codec import array_codec

if TYPE_CHECKING:
    import numpy as np
    import torch

    from omni_mp.wire.messages import Finished


# ---- producers (stage side) ---------------------------------------------------------------------
def audio_info(samples: torch.Tensor, sample_rate: int) -> dict[str, torch.Tensor | int]:
    """AdditionalInformation of an audio chunk: samples float32 [n]."""
    return {AUDIO_KEY: samples.float().contiguous(), SAMPLE_RATE_KEY: sample_rate}


def image_info(pixels: torch.Tensor, *, preview_step: int | None = None) -> dict[str, torch.Tensor | int]:
    """AdditionalInformation of an image chunk: pixels uint8 [H, W, 3]."""
    rgb_array(pixels, IMAGE_KEY)
    info: dict[str, torch.Tensor | int] = {IMAGE_KEY: pixels.contiguous()}
    if preview_step is not None:
        info[IMAGE_STEP_KEY] = preview_step
    return info


# ---- parsers ------------------------------------------------------------------------------------
def audio_of(info: Mapping[str, Any] | None) -> tuple[Any, int] | None:
    """(samples, sample_rate) of a chunk's AdditionalInformation; None if it carries no samples;
    ValueError if its audio entries are malformed."""
    if not info or AUDIO_KEY not in info:
        return None
    samples, rate = info[AUDIO_KEY], info.get(SAMPLE_RATE_KEY)
    codec = array_codec(samples)
    dtype, shape, _ = codec.header(samples, AUDIO_KEY) if codec else (type(samples).__name__, [], 0)
    if dtype != "float32" or len(shape) != 1:
        raise ValueError(f"{AUDIO_KEY}: expected a 1-D float32 array, got {dtype} of shape {shape}")
    if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
        raise ValueError(f"{SAMPLE_RATE_KEY}: expected a positive int, got {rate!r}")
    return (samples, rate) if shape[0] else None


class ImageChunk(NamedTuple):
    """An image of an image stage: a preview decoded after `step` denoising steps, or the
    final image (`step` None). `pixels`: numpy uint8 [height, width, 3], RGB."""

    pixels: np.ndarray
    step: int | None


def _image_step(info: Mapping[str, Any]) -> int | None:
    step = info.get(IMAGE_STEP_KEY)
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"{IMAGE_STEP_KEY}: expected a non-negative int, got {step!r}")
    return step


def image_of(info: Mapping[str, Any] | None) -> ImageChunk | None:
    """The image a chunk's AdditionalInformation carries (a preview or the final one) as numpy,
    None if it has none; ValueError if its image entries are malformed."""
    if not info or IMAGE_KEY not in info:
        return None
    step = _image_step(info)
    return ImageChunk(rgb_array(info[IMAGE_KEY], IMAGE_KEY), step)


def chunk_audio(chunk: object) -> tuple[Any, int] | None:
    """`audio_of` a stage output chunk (or any event with `additional_information`)."""
    return audio_of(getattr(chunk, "additional_information", None))


def chunk_image(chunk: object) -> ImageChunk | None:
    """`image_of` a stage output chunk (or any event with `additional_information`)."""
    return image_of(getattr(chunk, "additional_information", None))


def final_image(done: Finished) -> np.ndarray:
    """The image of a finished request: numpy uint8 [height, width, 3] from the first final
    stage that made one; ValueError if none did (a pipeline whose final stages make no images)."""
    for out in done.outputs:
        if out.image is not None:
            return rgb_array(out.image, f"outputs[stage {out.stage_id}].image")
    stages = [o.stage_id for o in done.outputs]
    raise ValueError(f"request {done.request_id!r}: no final stage returned an image (final stages {stages})")


# ---- collectors (coordinator side: received tensors are views of the message buffer) ------------
class AudioParts:
    """A request's audio chunks from one stage, joined at the end; bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[torch.Tensor] = []
        self.nbytes = 0
        self.sample_rate: int | None = None

    def add(self, info: Mapping[str, Any] | None) -> None:
        got = audio_of(info)
        if got is None:
            return
        samples, rate = got
        if self.sample_rate is not None and rate != self.sample_rate:
            raise ValueError(f"sample_rate changed from {self.sample_rate} to {rate} within a request")
        if self.nbytes + samples.numel() * 4 > self.max_bytes:
            raise ValueError(f"audio output exceeds max_tensor_bytes ({self.max_bytes})")
        self.sample_rate = rate
        self.parts.append(samples.clone())
        self.nbytes += samples.numel() * 4

    def joined(self) -> torch.Tensor:
        import torch  # the coordinator's side only: the client never joins audio

        return torch.cat(self.parts) if self.parts else torch.empty(0)


class FinalImage:
    """The final image of a request from one stage: at most one, bounded in bytes. Previews
    are checked and passed over (streaming clients see them as chunks)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pixels: torch.Tensor | None = None

    def add(self, info: Mapping[str, Any] | None) -> None:
        got = image_of(info)
        if got is None or got.step is not None:
            return
        if got.pixels.size > self.max_bytes:
            raise ValueError(f"image output of {got.pixels.size} bytes exceeds max_tensor_bytes ({self.max_bytes})")
        if self.pixels is not None:
            raise ValueError("a second final image for one request (an image stage makes one per request)")
        self.pixels = info[IMAGE_KEY].clone()  # type: ignore[index]

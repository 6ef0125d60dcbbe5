"""Audio outputs: how a stage's audio chunks travel, are collected, and are written.

A stage that produces audio (the diffusion kind) puts each step's new samples of a request
in its chunk's AdditionalInformation as `audio` (float32 [n], in [-1, 1]) with
`sample_rate`. The coordinator joins the chunks of a final stage into
`StageResult.audio`/`sample_rate` (bounded by `Limits.max_tensor_bytes`); a streaming client
sees each chunk as it comes (`pcm_chunks`); the CLI writes `.wav` files
(`omni_mp.audio_io.write_wav`, which also reads audio files and resamples).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from omni_mp.wire.messages import AUDIO_KEY, SAMPLE_RATE_KEY


def audio_info(samples: torch.Tensor, sample_rate: int) -> dict[str, torch.Tensor | int]:
    return {AUDIO_KEY: samples.to(torch.float32).contiguous(), SAMPLE_RATE_KEY: sample_rate}


def chunk_audio(info: dict | None) -> tuple[torch.Tensor, int] | None:
    """(samples, sample_rate) of a chunk's AdditionalInformation, None if it has no audio;
    ValueError if the entries are malformed."""
    if not info or AUDIO_KEY not in info:
        return None
    samples, rate = info[AUDIO_KEY], info.get(SAMPLE_RATE_KEY)
    if not isinstance(samples, torch.Tensor) or samples.ndim != 1 or samples.dtype != torch.float32:
        raise ValueError(f"audio: expected a 1-D float32 tensor, got {getattr(samples, 'shape', type(samples))}")
    if not isinstance(rate, int) or rate <= 0:
        raise ValueError(f"sample_rate: expected a positive int, got {rate!r}")
    return samples, rate


class AudioParts:
    """A request's audio chunks from one stage, joined at the end; bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[torch.Tensor] = []
        self.nbytes = 0
        self.sample_rate: int | None = None

    def add(self, info: dict | None) -> None:
        got = chunk_audio(info)
        if got is None:
            return
        samples, rate = got
        if self.sample_rate is not None and rate != self.sample_rate:
            raise ValueError(f"sample_rate changed from {self.sample_rate} to {rate} within a request")
        if self.nbytes + samples.numel() * 4 > self.max_bytes:
            raise ValueError(f"audio output exceeds max_tensor_bytes ({self.max_bytes})")
        self.sample_rate = rate
        self.parts.append(samples.clone())  # the received tensor is a view of the message buffer
        self.nbytes += samples.numel() * 4

    def joined(self) -> torch.Tensor:
        return torch.cat(self.parts) if self.parts else torch.empty(0)


def pcm_chunks(events: Iterable[object]) -> Iterator[tuple[torch.Tensor, int]]:
    """The (samples, sample_rate) chunks in a client's `stream()` events, as they arrive."""
    for ev in events:
        got = chunk_audio(getattr(ev, "additional_information", None))
        if got is not None and got[0].numel():
            yield got

"""Audio outputs: how a stage's audio chunks travel, are collected, and are written.

A stage that produces audio (the diffusion kind) puts each step's new samples of a request
in its chunk's AdditionalInformation as `audio` (float32 [n], in [-1, 1]) with
`sample_rate`. The coordinator joins the chunks of a final stage into
`StageResult.audio`/`sample_rate` (bounded by `Limits.max_tensor_bytes`); a streaming client
sees each chunk as it comes (`pcm_chunks`); the CLI writes `.wav` files (`write_wav`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

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


def write_wav(path: str | Path, samples: torch.Tensor, sample_rate: int) -> None:
    """A mono 32-bit float WAV (format 3, IEEE float): the samples exactly as produced."""
    data = samples.detach().to(torch.float32).contiguous().cpu().numpy().astype("<f4").tobytes()
    header = b"RIFF" + struct.pack("<I", 4 + 26 + 12 + 8 + len(data)) + b"WAVE"
    fmt = b"fmt " + struct.pack("<IHHIIHHH", 18, 3, 1, sample_rate, sample_rate * 4, 4, 32, 0)
    fact = b"fact" + struct.pack("<II", 4, len(data) // 4)
    Path(path).write_bytes(header + fmt + fact + b"data" + struct.pack("<I", len(data)) + data)


def read_wav(path: str | Path) -> tuple[torch.Tensor, int]:
    """A WAV file as mono float32 in [-1, 1] and its sample rate: what `write_wav` writes, and
    the usual 16/24/32-bit PCM or float files (channels are averaged)."""
    blob = Path(path).read_bytes()
    if blob[:4] != b"RIFF" or blob[8:12] != b"WAVE":
        raise ValueError(f"{path}: not a WAV file")
    pos, fmt, data = 12, None, None
    while pos + 8 <= len(blob):
        tag, size = blob[pos : pos + 4], struct.unpack("<I", blob[pos + 4 : pos + 8])[0]
        body = blob[pos + 8 : pos + 8 + size]
        if tag == b"fmt ":
            code, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if code == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the sub-format's code
                code = struct.unpack("<H", body[24:26])[0]
            fmt = (code, channels, rate, bits)
        elif tag == b"data":
            data = body
        pos += 8 + size + (size & 1)
    if fmt is None or data is None:
        raise ValueError(f"{path}: missing fmt or data chunk")
    code, channels, rate, bits = fmt
    if channels < 1 or (code, bits) not in {(1, 16), (1, 24), (1, 32), (3, 32)}:
        raise ValueError(f"{path}: unsupported WAV format {code} with {bits} bits (PCM 16/24/32 or float32 only)")
    width = bits // 8
    usable = len(data) - len(data) % (width * channels)
    raw = bytearray(data[:usable])
    if code == 3:
        samples = torch.frombuffer(raw, dtype=torch.float32)
    elif bits == 24:  # little-endian 3-byte ints: widen to int32 by the top bytes
        b = torch.frombuffer(raw, dtype=torch.uint8).view(-1, 3).to(torch.int32)
        samples = ((b[:, 0] << 8) | (b[:, 1] << 16) | (b[:, 2] << 24)).to(torch.float32) / 2.0**31
    else:
        dtype = torch.int16 if bits == 16 else torch.int32
        samples = torch.frombuffer(raw, dtype=dtype).to(torch.float32) / 2.0 ** (bits - 1)
    return samples.view(-1, channels).mean(dim=1), rate


def resample(samples: torch.Tensor, orig_rate: int, target_rate: int, *, zeros: int = 16) -> torch.Tensor:
    """Band-limited resampling (a Kaiser-windowed sinc, polyphase: one filter per output phase)."""
    if orig_rate == target_rate:
        return samples
    g = math.gcd(orig_rate, target_rate)
    up, down = target_rate // g, orig_rate // g
    cutoff = min(1.0, up / down)  # below the lower Nyquist frequency of the two rates
    width = math.ceil(zeros / cutoff)  # input samples on each side of an output sample
    # Filter taps for each output phase p (output time p/up in input samples): x - p/up.
    x = (
        torch.arange(-width, width + 1, dtype=torch.float64)[None, :]
        - torch.arange(up, dtype=torch.float64)[:, None] / up
    )
    window = torch.special.i0(8.6 * torch.sqrt((1 - (x / (width + 1)) ** 2).clamp(min=0))) / torch.special.i0(
        torch.tensor(8.6, dtype=torch.float64)
    )
    taps = (cutoff * torch.sinc(cutoff * x) * window).to(torch.float32)  # [up, 2 * width + 1]
    n_out = math.ceil(samples.numel() * up / down)
    padded = torch.nn.functional.pad(samples.to(torch.float32)[None, None], (width, width + down + 1))
    # Output k is phase (k*down) % up at input offset (k*down) // up: convolve each phase at stride.
    frames = torch.nn.functional.conv1d(padded, taps[:, None, :])[0]  # [up, n_in + down + 2]
    k = torch.arange(n_out)
    return frames[(k * down) % up, (k * down) // up]

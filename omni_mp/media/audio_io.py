"""Audio files and sample rates: reading any file libsndfile decodes (WAV, FLAC, OGG, MP3, ...)
into mono float32, writing WAV (16-bit PCM by default), and resampling to a model's rate.

numpy, soundfile (libsndfile) and soxr (libsoxr) only: no torch, so a client can read its
files without it. Every failure a file can cause is an `AudioFileError` (a ValueError) naming
the file and what is wrong, never a library's own exception.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
import soxr

# The sample rates accepted anywhere (the wire's AudioInput bound too): soxr's cost does not
# depend on how two rates factor, so the bound only keeps the input's size per second sane.
MIN_RATE, MAX_RATE = 1_000, 384_000
# What read_audio reads at most: the longest audio a stage config may take (MediaLimits), and
# what one tensor on the wire holds (Limits.max_tensor_bytes' default, float32).
MAX_READ_S = 3600.0
MAX_READ_SAMPLES = 2**28
_UNKNOWN_FRAMES = 2**63 - 1  # libsndfile's frame count of a stream that does not declare it
_BLOCK_SAMPLES = 1 << 20  # samples (frames x channels) decoded at a time: 4 MiB

# libsndfile reads a WAV cut inside its data up to the cut and notes the size the header
# declared in its log ("data : 32000 (should be 956)"); 0 and 0xFFFFFFFF are the placeholders
# of writers that stream (the size was unknown), not a cut.
_WAV_DATA_LOG = re.compile(r"^data : (\d+) \(should be (\d+)\)", re.MULTILINE)
_UNKNOWN_SIZES = {0, 0xFFFFFFFF}


class AudioFileError(ValueError):
    """An audio file that cannot be used; the message names the file and why."""


def _check_rate(rate: int, what: str, error: type[ValueError] = ValueError) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise error(f"{what}: sample rate {rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")


def downmix(frames: np.ndarray) -> np.ndarray:
    """[frames, channels] -> mono [frames]: the mean of the channels (equal weights, so a
    stereo file whose channels are equal comes back unchanged)."""
    return frames.mean(axis=1, dtype=np.float32) if frames.shape[1] > 1 else frames[:, 0]


def _truncated_wav(info: str) -> str | None:
    m = _WAV_DATA_LOG.search(info)
    if m is None or int(m.group(1)) in _UNKNOWN_SIZES or int(m.group(1)) <= int(m.group(2)):
        return None
    return f"truncated: its header declares {m.group(1)} bytes of samples, the file holds {m.group(2)}"


def _read_mono(f: soundfile.SoundFile, p: Path, max_frames: int) -> np.ndarray:
    """The file's frames down-mixed block by block: memory is the mono result plus one block
    of at most _BLOCK_SAMPLES, whatever the channel count; more than `max_frames` frames is
    refused as soon as they are read (the frame count a header declares may lie)."""
    block = max(1, _BLOCK_SAMPLES // f.channels)
    buf = np.empty((block, f.channels), dtype=np.float32)
    parts: list[np.ndarray] = []
    n = 0
    for _ in range(max_frames // block + 2):  # bounded: each turn reads a full block or ends
        got = f.read(block, dtype="float32", always_2d=True, out=buf)
        n += got.shape[0]
        if n > max_frames:
            raise AudioFileError(f"{p}: more than {max_frames / f.samplerate:g} s of audio; longer files are not read")
        if got.shape[0]:
            parts.append(downmix(got).copy())  # (a mono block is a view of `buf`)
        if got.shape[0] < block:
            break
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)


def read_audio(path: str | Path, max_seconds: float = MAX_READ_S) -> tuple[np.ndarray, int]:
    """An audio file as mono float32 [samples] in [-1, 1] and its sample rate. Multi-channel
    files are down-mixed by `downmix` (the mean of the channels). Files longer than
    `max_seconds` (or than one wire tensor holds) are refused before or while they are read,
    so a small file that decodes to hours (FLAC of silence) costs no memory."""
    p = Path(path)
    if not p.is_file():
        raise AudioFileError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    try:
        with soundfile.SoundFile(p) as f:
            cut = _truncated_wav(f.extra_info) if f.format in {"WAV", "WAVEX"} else None
            if cut is not None:
                raise AudioFileError(f"{p}: {cut}")
            rate = f.samplerate
            _check_rate(rate, str(p), AudioFileError)
            max_frames = min(int(max_seconds * rate), MAX_READ_SAMPLES)
            if max_frames < f.frames < _UNKNOWN_FRAMES:
                raise AudioFileError(f"{p}: {f.frames / rate:.1f} s of audio; at most {max_frames / rate:g} s is read")
            samples = _read_mono(f, p, max_frames)
    except soundfile.SoundFileError as err:  # libsndfile's reason, e.g. "Format not recognised"
        reason = str(err).removeprefix(f"Error opening {str(p)!r}: ")
        raise AudioFileError(f"{p}: not a readable audio file ({reason})") from None
    if samples.size == 0:
        raise AudioFileError(f"{p}: no audio samples")
    if not np.isfinite(samples).all():
        raise AudioFileError(f"{p}: samples must be finite (NaN or infinity found)")
    return samples, rate


def _mono_float32(samples: Any) -> np.ndarray:
    """A 1-D float32 numpy view or copy of an array-like (numpy, a CPU torch tensor, a list)."""
    if hasattr(samples, "detach"):  # a torch tensor, without importing torch
        samples = samples.detach().cpu().numpy()
    out = np.asarray(samples, dtype=np.float32)
    if out.ndim != 1:
        raise ValueError(f"samples: expected mono audio [samples], got shape {list(out.shape)}")
    return np.ascontiguousarray(out)


def write_wav(path: str | Path, samples: Any, sample_rate: int, *, float32: bool = False) -> None:
    """A mono WAV file: 16-bit PCM by default (what every player and Python's `wave` read;
    samples outside [-1, 1] are clipped), or 32-bit float (the samples exactly) on request."""
    data = _mono_float32(samples)
    _check_rate(sample_rate, str(path))
    if not float32:
        if not np.isfinite(data).all():
            raise ValueError(f"{path}: samples must be finite to be written as 16-bit PCM")
        data = np.clip(data, -1.0, 1.0)
    soundfile.write(Path(path), data, sample_rate, format="WAV", subtype="FLOAT" if float32 else "PCM_16")


def resample(samples: Any, orig_rate: int, target_rate: int) -> np.ndarray:
    """Mono float32 samples at `target_rate`: a new array (a copy where the rates are equal).

    libsoxr (its default "HQ" quality: linear phase, 20-bit precision): measured on 60 s of
    audio to 16 kHz (benchmarks/resample.py), about 10 ms and no intermediate larger than a
    few blocks whatever the rates, 44,101 Hz (coprime to 16,000) included. The windowed-sinc
    polyphase filter it replaced built an [up, n_in] array (44.1 kHz: 12.7 s and +3.2 GB;
    44,101 Hz: 172 GB); scipy's resample_poly designs a filter of 20 * max(up, down) + 1 taps,
    so its cost follows how the rates factor (44,101 Hz: 137 ms and 42 MB vs 32 ms and 4 MB
    at 44.1 kHz; soxr: 11 ms at both)."""
    data = _mono_float32(samples)
    _check_rate(orig_rate, "orig_rate")
    _check_rate(target_rate, "target_rate")
    if orig_rate == target_rate or data.size == 0:
        return data.copy()
    return soxr.resample(data, orig_rate, target_rate, quality="HQ")

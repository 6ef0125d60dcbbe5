"""An uploaded audio file -> mono float32 samples and their rate (`/v1/audio/transcriptions`).

libsndfile (soundfile) reads WAV, FLAC, MP3 and Ogg (Vorbis, Opus); what it cannot read goes to
FFmpeg's demuxers and decoders through PyAV, limited to the containers OpenAI's endpoint takes
(MP4/M4A, WebM/Matroska, and the ones libsndfile reads). The file's content decides, not its
name or declared type. The duration is checked against the stage's limit before decoding
where the file declares it, and while decoding where it does not (or lies), so a file never
decodes past the limit; the sample rate must lie in MIN_RATE..MAX_RATE."""

from __future__ import annotations

import io

import numpy as np
import soundfile

from omni_mp.media.audio_io import MAX_RATE, MIN_RATE, downmix

# PyAV's container names (comma-separated aliases) whose audio this server decodes.
_CONTAINERS = frozenset({"mov", "mp4", "m4a", "matroska", "webm", "ogg", "mp3", "wav", "flac", "aac"})


class AudioUploadError(ValueError):
    """The file is not audio this server decodes, or breaks a limit: the message says which."""


def _check_rate(rate: int) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioUploadError(f"sample rate {rate} Hz outside {MIN_RATE}..{MAX_RATE} Hz")


def _too_long(seconds: float, max_s: float | None) -> None:
    if max_s is not None and seconds > max_s:
        raise AudioUploadError(f"audio of {seconds:.2f}s > the stage's max_audio_s={max_s:g}")


def _with_soundfile(raw: bytes, max_s: float | None) -> tuple[np.ndarray, int] | None:
    """None when libsndfile does not know the format (PyAV's turn)."""
    try:
        f = soundfile.SoundFile(io.BytesIO(raw))
    except (soundfile.SoundFileError, RuntimeError):
        return None
    with f:
        _check_rate(f.samplerate)
        if f.frames < 2**62:  # (a stream that declares no length reads as 2**63 - 1 frames)
            _too_long(f.frames / f.samplerate, max_s)
        limit = -1 if max_s is None else int(max_s * f.samplerate) + 1  # one frame past the limit at most
        try:
            frames = f.read(frames=limit, dtype="float32", always_2d=True)
        except (soundfile.SoundFileError, RuntimeError) as err:
            raise AudioUploadError(f"the audio does not decode ({err})") from None
        _too_long(frames.shape[0] / f.samplerate, max_s)
        return downmix(frames), f.samplerate


def _with_pyav(raw: bytes, max_s: float | None) -> tuple[np.ndarray, int]:
    import av

    try:
        container = av.open(io.BytesIO(raw), mode="r")
    except (av.FFmpegError, ValueError) as err:
        raise AudioUploadError(f"not an audio file this server reads ({err})") from None
    with container:
        names = set(container.format.name.split(","))
        if not names & _CONTAINERS:
            raise AudioUploadError(f"container {container.format.name!r} is not one this server reads")
        if not container.streams.audio:
            raise AudioUploadError("the file has no audio stream")
        stream = container.streams.audio[0]
        if stream.duration is not None and stream.time_base is not None:
            _too_long(float(stream.duration * stream.time_base), max_s)
        return _decode_stream(container, stream, max_s)


def _decode_stream(container: object, stream: object, max_s: float | None) -> tuple[np.ndarray, int]:
    import av

    # Planar float32 at the stream's own rate and layout: downmixed below, as libsndfile's are.
    resampler = av.AudioResampler(format="fltp")
    parts: list[np.ndarray] = []
    rate, total = 0, 0

    def add(frames: list[av.AudioFrame]) -> None:
        nonlocal rate, total
        for out in frames:
            rate = out.sample_rate
            _check_rate(rate)
            parts.append(out.to_ndarray().T)  # [samples, channels]
            total += out.samples
            _too_long(total / rate, max_s)

    try:
        for packet in container.demux(stream):  # type: ignore[attr-defined]
            for frame in packet.decode():  # (the last, empty packet flushes the decoder)
                add(resampler.resample(frame))
        add(resampler.resample(None))
    except av.FFmpegError as err:
        raise AudioUploadError(f"the audio does not decode ({err})") from None
    if not parts or total == 0:
        raise AudioUploadError("the audio has no samples")
    frames = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return downmix(np.ascontiguousarray(frames, dtype=np.float32)), rate


def decode_upload(raw: bytes, max_s: float | None) -> tuple[np.ndarray, int]:
    """Mono float32 samples and their rate; AudioUploadError for anything unusable."""
    if not raw:
        raise AudioUploadError("the file is empty")
    got = _with_soundfile(raw, max_s)
    samples, rate = got if got is not None else _with_pyav(raw, max_s)
    if samples.size == 0:
        raise AudioUploadError("the audio has no samples")
    if not np.isfinite(samples).all():
        raise AudioUploadError("the audio holds samples that are not finite")
    return samples, rate

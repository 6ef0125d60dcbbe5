"""Audio files and resampling (omni_mp/audio_io.py): the formats a client may send, read as mono
float32; broken files refused with an error naming the file; the CLI's WAV readable by Python's
`wave`; resampling that keeps length and pitch at every rate of benchmarks.resample, in
bounded time and memory whatever the two rates' common factors.

Fixtures are written with soundfile itself (no sox or ffmpeg on the test machines)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from omni_mp.client.media import multi_modal_input
from omni_mp.media.audio_io import AudioFileError, read_audio, resample, write_wav

REPO = Path(__file__).resolve().parent.parent
RATES = (44_100, 48_000, 22_050, 8_000, 44_101)  # benchmarks.resample's inputs
TARGET = 16_000


def sine(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def peak_frequency(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spectrum)) * rate / x.size


# ---- reading ------------------------------------------------------------------------------

# subtype -> the largest error its quantization allows (one step of the integer format).
WAV_SUBTYPES = {"PCM_16": 2.0**-15, "PCM_24": 2.0**-23, "PCM_32": 2.0**-31, "FLOAT": 0.0}


@pytest.mark.parametrize("subtype", sorted(WAV_SUBTYPES))
def test_reads_wav_of_each_sample_format(tmp_path: Path, subtype: str) -> None:
    x = sine(440, 22_050, 0.5)
    soundfile.write(tmp_path / "a.wav", x, 22_050, subtype=subtype)
    got, rate = read_audio(tmp_path / "a.wav")
    assert rate == 22_050 and got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, x, rtol=0, atol=WAV_SUBTYPES[subtype])


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24"])
def test_reads_flac(tmp_path: Path, subtype: str) -> None:
    x = sine(440, 48_000, 0.5)
    soundfile.write(tmp_path / "a.flac", x, 48_000, subtype=subtype)
    got, rate = read_audio(tmp_path / "a.flac")
    assert rate == 48_000 and got.shape == x.shape
    np.testing.assert_allclose(got, x, rtol=0, atol=WAV_SUBTYPES[subtype])


def test_reads_mp3(tmp_path: Path) -> None:
    """Lossy: the rate, about the length, and the tone's frequency survive."""
    x = sine(1000, 44_100, 1.0)
    soundfile.write(tmp_path / "a.mp3", x, 44_100, format="MP3")
    got, rate = read_audio(tmp_path / "a.mp3")
    assert rate == 44_100 and abs(got.size - x.size) < 44_100 // 10
    assert abs(peak_frequency(got, rate) - 1000) <= 2 * rate / got.size


def test_multi_channel_files_are_the_mean_of_their_channels(tmp_path: Path) -> None:
    left, right = sine(440, 16_000, 0.25), sine(1000, 16_000, 0.25, amplitude=0.2)
    soundfile.write(tmp_path / "stereo.wav", np.stack([left, right], axis=1), 16_000, subtype="FLOAT")
    got, _ = read_audio(tmp_path / "stereo.wav")
    np.testing.assert_allclose(got, (left + right) / 2, rtol=0, atol=1e-7)  # not interleaved, not 2x long
    six = np.stack([left * (i + 1) / 6 for i in range(6)], axis=1)
    soundfile.write(tmp_path / "six.flac", six, 16_000, subtype="PCM_24")
    got, _ = read_audio(tmp_path / "six.flac")
    np.testing.assert_allclose(got, six.mean(axis=1), rtol=0, atol=2.0**-22)


def test_media_files_take_any_readable_format(tmp_path: Path) -> None:
    x = sine(440, 24_000, 0.5)
    soundfile.write(tmp_path / "a.flac", x, 24_000)
    mm = multi_modal_input(audios=[tmp_path / "a.flac"])
    assert mm is not None and mm.audios[0].sample_rate == 24_000
    samples = mm.audios[0].samples  # numpy: the client side imports no torch
    assert samples.dtype == np.float32 and samples.shape == (x.size,)


def _broken_files(tmp_path: Path) -> dict[str, Path]:
    """Each kind of unusable file, by name."""
    soundfile.write(tmp_path / "good.wav", sine(440, 16_000, 0.5), 16_000, subtype="PCM_16")
    wav = (tmp_path / "good.wav").read_bytes()
    soundfile.write(tmp_path / "good.flac", sine(440, 16_000, 0.5), 16_000)
    flac = (tmp_path / "good.flac").read_bytes()
    nan = np.full(100, np.nan, dtype=np.float32)
    soundfile.write(tmp_path / "nan.wav", nan, 16_000, subtype="FLOAT")
    soundfile.write(tmp_path / "slow.wav", sine(10, 500, 0.5), 500)  # below the 1,000 Hz bound
    blobs = {
        "empty.wav": b"",
        "garbage.wav": b"not audio at all " * 20,
        "cut_in_fmt.wav": wav[:30],
        "header_only.wav": wav[:44],
        "cut_in_data.wav": wav[: len(wav) // 3],
        "channels_65535.wav": wav[:22] + (65535).to_bytes(2, "little") + wav[24:],
        "cut.flac": flac[: len(flac) // 2],
    }
    for name, blob in blobs.items():
        (tmp_path / name).write_bytes(blob)
    names = [*blobs, "nan.wav", "slow.wav"]
    return {n: tmp_path / n for n in names} | {"missing": tmp_path / "missing.wav", "directory": tmp_path}


def test_unusable_files_raise_a_value_error_naming_the_file(tmp_path: Path) -> None:
    for kind, path in _broken_files(tmp_path).items():
        with pytest.raises(AudioFileError) as info:
            read_audio(path)
        msg = str(info.value)
        assert isinstance(info.value, ValueError) and msg.startswith(f"{path}: "), (kind, msg)
        assert info.value.__cause__ is None and "soundfile" not in msg, (kind, msg)
        print(f"{kind}: {msg}")


# ---- writing ------------------------------------------------------------------------------


def test_written_wav_is_16_bit_pcm_that_python_wave_reads(tmp_path: Path) -> None:
    x = sine(440, 24_000, 0.5, amplitude=0.9)
    x[:3] = [1.5, -1.5, 1.0]  # out of range: clipped, not wrapped
    write_wav(tmp_path / "out.wav", torch.from_numpy(x), 24_000)  # the CLI passes torch tensors
    with wave.open(str(tmp_path / "out.wav"), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 24_000, x.size)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert pcm[0] == 32767 and pcm[1] == -32768
    np.testing.assert_allclose(pcm[3:] / 32768.0, x[3:], rtol=0, atol=2.0**-15)
    got, rate = read_audio(tmp_path / "out.wav")
    assert rate == 24_000
    np.testing.assert_allclose(got[3:], x[3:], rtol=0, atol=2.0**-15)


def test_float32_wav_on_request_keeps_the_samples_exactly(tmp_path: Path) -> None:
    x = sine(440, 24_000, 0.5) * 3  # beyond [-1, 1]: float keeps it
    write_wav(tmp_path / "out.wav", x, 24_000, float32=True)
    assert soundfile.info(str(tmp_path / "out.wav")).subtype == "FLOAT"
    got, _ = read_audio(tmp_path / "out.wav")
    np.testing.assert_array_equal(got, x)


def test_write_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mono"):
        write_wav(tmp_path / "a.wav", np.zeros((2, 100), np.float32), 16_000)
    with pytest.raises(ValueError, match="finite"):
        write_wav(tmp_path / "a.wav", np.full(10, np.nan, np.float32), 16_000)
    with pytest.raises(ValueError, match="sample rate"):
        write_wav(tmp_path / "a.wav", np.zeros(10, np.float32), 999)


# ---- resampling ---------------------------------------------------------------------------


@pytest.mark.parametrize("rate", RATES)
def test_resampling_keeps_length_and_pitch(rate: int) -> None:
    """60 s of a 1 kHz tone (under every rate's Nyquist frequency) to 16 kHz and back up."""
    x = sine(1000, rate, 60.0)
    t0 = time.perf_counter()
    y = resample(x, rate, TARGET)
    elapsed = time.perf_counter() - t0
    print(f"{rate} Hz -> {TARGET} Hz, 60 s: {elapsed * 1e3:.1f} ms")
    assert y.dtype == np.float32 and abs(y.size - x.size * TARGET / rate) <= 1
    assert abs(peak_frequency(y, TARGET) - 1000) <= TARGET / y.size  # within one FFT bin
    middle = y[TARGET:-TARGET]  # away from the edges' filter transients
    assert abs(np.sqrt(2 * np.mean(middle.astype(np.float64) ** 2)) - 0.5) < 0.005  # amplitude kept
    back = resample(y, TARGET, rate)
    assert abs(back.size - x.size) <= 1 and abs(peak_frequency(back, rate) - 1000) <= rate / back.size


@pytest.mark.parametrize("rate", [44_101, 383_999])
def test_resampling_memory_is_bounded_whatever_the_rates(rate: int) -> None:
    """Coprime rates cost what ordinary ones do: the rise of peak RSS of one call on 60 s
    (benchmarks.resample's measurement, in its own process) stays near the output's size."""
    cmd = [sys.executable, "-m", "benchmarks.resample", "--child", "soxr", str(rate), "--seconds", "60"]
    got = json.loads(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True, timeout=300).stdout)
    print(f"{rate} Hz -> {TARGET} Hz, 60 s: {got['time_s'] * 1e3:.1f} ms, peak +{got['peak_mb']:.1f} MB")
    output_mb = got["n_out"] * 4 / 2**20
    assert got["n_out"] == round(60 * TARGET) and got["peak_mb"] < output_mb + 32


def test_resample_bounds_and_copies() -> None:
    x = sine(440, TARGET, 0.1)
    same = resample(x, TARGET, TARGET)
    np.testing.assert_array_equal(same, x)
    assert not np.shares_memory(same, x)  # callers pass views of a message buffer
    assert resample(np.zeros(0, np.float32), 48_000, TARGET).size == 0
    for bad in (999, 384_001):
        with pytest.raises(ValueError, match="sample rate"):
            resample(x, bad, TARGET)
        with pytest.raises(ValueError, match="sample rate"):
            resample(x, TARGET, bad)
    with pytest.raises(ValueError, match="mono"):
        resample(np.zeros((2, 10), np.float32), 48_000, TARGET)


def test_long_and_many_channel_files_are_read_in_bounded_memory(tmp_path: Path) -> None:
    rate = 8_000
    data = np.random.default_rng(0).uniform(-0.5, 0.5, size=(3 * rate, 300)).astype(np.float32)
    path = tmp_path / "wide.wav"
    soundfile.write(path, data, rate, subtype="FLOAT")
    samples, got_rate = read_audio(path)  # blocks of a few thousand frames: still the exact mean
    assert got_rate == rate and np.allclose(samples, data.mean(axis=1), atol=1e-6)
    with pytest.raises(AudioFileError, match=r"wide\.wav: 3\.0 s of audio; at most 2 s is read"):
        read_audio(path, max_seconds=2)
    # A FLAC whose header declares no length (SF_COUNT_MAX frames): no attempt to hold it.
    flac = tmp_path / "stream.flac"
    soundfile.write(flac, data[:, :2], rate)
    raw = bytearray(flac.read_bytes())
    raw[21] &= 0xF0  # STREAMINFO's 36-bit total sample count: 0 = unknown
    raw[22:26] = bytes(4)
    flac.write_bytes(bytes(raw))
    with pytest.raises(AudioFileError, match=r"stream\.flac: "):
        read_audio(flac, max_seconds=2)

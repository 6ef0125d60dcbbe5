"""omni_mp.http.audio_in: uploaded files decoded by libsndfile or, for what it does not read,
PyAV; the duration limit holds whether the file declares its length or not (no pipeline here:
tests/test_http_transcriptions.py runs the endpoint)."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile
from PIL import Image

from omni_mp.http.audio_in import AudioUploadError, decode_upload
from tests.synthetic_media import pattern, tone


def _pyav_file(container: str, codec: str, samples: np.ndarray, rate: int, out_rate: int) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=out_rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize("container,codec,out_rate", [("ipod", "aac", 16_000), ("webm", "libopus", 48_000)])
def test_pyav_formats_decode_and_stop_at_the_limit(container: str, codec: str, out_rate: int) -> None:
    data = _pyav_file(container, codec, tone(3.0), 16_000, out_rate)
    with pytest.raises(soundfile.LibsndfileError):
        soundfile.info(io.BytesIO(data))  # (libsndfile does not read it: PyAV does)
    samples, rate = decode_upload(data, 10.0)
    assert rate == out_rate and samples.dtype == np.float32 and samples.ndim == 1
    assert 3.0 <= samples.size / rate < 3.2  # (an encoder's priming adds a few ms)
    assert 0.25 < np.abs(samples).max() < 0.35
    with pytest.raises(AudioUploadError, match=r"max_audio_s=1\b"):
        decode_upload(data, 1.0)


def test_libsndfile_formats_stereo_is_averaged_and_the_limit_holds() -> None:
    left = tone(2.0, 8_000)
    buf = io.BytesIO()
    soundfile.write(buf, np.stack([left, np.zeros_like(left)], axis=1), 8_000, format="FLAC")
    samples, rate = decode_upload(buf.getvalue(), 5.0)
    assert rate == 8_000 and np.allclose(samples, left / 2, atol=1e-4)
    with pytest.raises(AudioUploadError, match=r"audio of 2.00s > the stage's max_audio_s=1.5"):
        decode_upload(buf.getvalue(), 1.5)


def test_what_is_not_audio_is_refused() -> None:
    png = io.BytesIO()
    Image.fromarray(pattern()).save(png, format="PNG")
    for data, why in [(b"", "empty"), (png.getvalue(), "this server reads"), (b"\x00" * 4096, "this server reads")]:
        with pytest.raises(AudioUploadError, match=why):
            decode_upload(data, 30.0)
    silent = io.BytesIO()
    soundfile.write(silent, np.zeros(0, dtype=np.float32), 16_000, format="WAV")
    with pytest.raises(AudioUploadError, match="no samples"):
        decode_upload(silent.getvalue(), 30.0)
    fast = io.BytesIO()
    soundfile.write(fast, tone(0.1, 400_000), 400_000, format="WAV")
    with pytest.raises(AudioUploadError, match="sample rate 400000 Hz"):
        decode_upload(fast.getvalue(), 30.0)

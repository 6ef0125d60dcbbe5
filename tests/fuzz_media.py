"""Malformed and extreme media for the fuzz test (tests/test_media_fuzz.py): WAV, FLAC, PNG and
JPEG files and in-memory arrays, each with what a client must get for it: an error matching
`error`, or a reply (where `same_as` is given: the same reply as that well-formed input).

Every file is made here from numpy, soundfile and PIL, then cut or patched byte by byte.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from PIL import Image

from tests.synthetic_media import pattern, tone


@dataclass(frozen=True)
class Case:
    name: str
    audios: list[Any] = field(default_factory=list)  # paths, or (samples, rate)
    images: list[Any] = field(default_factory=list)  # paths, or uint8 arrays
    error: str | None = None  # a regex of the error's message; None: it must get a reply
    same_as: tuple[list[Any], list[Any]] | None = None  # (audios, images) giving the same reply


def _wav(path: Path, data: np.ndarray, rate: int, subtype: str = "PCM_16") -> Path:
    soundfile.write(path, data, rate, format="WAV", subtype=subtype)
    return path


def _patched(src: Path, dst: Path, at: int, value: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    raw[at : at + len(value)] = value
    dst.write_bytes(bytes(raw))
    return dst


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose IHDR declares `width` x `height` RGB, with one tiny IDAT (a lying size)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)))
    return path


def _jpeg_with_size(path: Path, width: int, height: int) -> Path:
    """A small JPEG whose SOF marker is patched to declare `width` x `height`."""
    buf = io.BytesIO()
    Image.fromarray(pattern(16)).save(buf, format="JPEG")
    raw = bytearray(buf.getvalue())
    sof = raw.index(b"\xff\xc0")
    raw[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    path.write_bytes(bytes(raw))
    return path


def audio_file_cases(tmp: Path, window_s: float) -> list[Case]:
    rng = np.random.default_rng(0)
    mono = tone(1.0, 16_000)
    good = _wav(tmp / "good.wav", mono, 16_000)
    stereo = np.stack([mono, rng.uniform(-0.3, 0.3, mono.size).astype(np.float32)], axis=1)
    wide = rng.uniform(-0.3, 0.3, size=(8_000, 64)).astype(np.float32)
    nan = mono.copy()
    nan[100] = np.nan
    flac = tmp / "good.flac"
    soundfile.write(flac, mono, 16_000)
    flac_bytes = flac.read_bytes()
    long_lie = _patched(flac, tmp / "lying_length.flac", 21, bytes([flac_bytes[21] | 0x0F, 0xFF, 0xFF, 0xFF, 0xFF]))
    bomb = tmp / "bomb.flac"  # 20 minutes of silence: a few KB that decode to 77 MB
    soundfile.write(bomb, np.zeros(16_000 * 1200, dtype=np.float32), 16_000)
    (tmp / "cut.flac").write_bytes(flac_bytes[: len(flac_bytes) // 2])
    (tmp / "cut_header.wav").write_bytes(good.read_bytes()[:20])
    (tmp / "header.wav").write_bytes(good.read_bytes()[:44])  # declares 1 s of samples, holds none
    (tmp / "noise.wav").write_bytes(rng.bytes(4096))
    (tmp / "empty.wav").write_bytes(b"")
    too_long = _wav(tmp / "too_long.wav", np.zeros(int((window_s + 1) * 8_000), np.float32), 8_000)
    return [
        Case("wav: header cut", [tmp / "cut_header.wav"], error="cut_header.wav: not a readable audio file"),
        Case("wav: header only", [tmp / "header.wav"], error="header.wav: (truncated|no audio samples)"),
        Case("wav: data size lies", [_patched(good, tmp / "lying.wav", 40, struct.pack("<I", 10**8))],
             error="truncated: its header declares"),
        Case("wav: zero frames", [_wav(tmp / "zero.wav", np.zeros(0, np.float32), 16_000)], error="no audio samples"),
        Case("wav: NaN samples", [_wav(tmp / "nan.wav", nan, 16_000, "FLOAT")], error="must be finite"),
        Case("wav: 64 channels", [_wav(tmp / "wide.wav", wide, 8_000, "FLOAT")],
             same_as=([(wide.mean(axis=1), 8_000)], [])),
        Case("wav: stereo", [_wav(tmp / "stereo.wav", stereo, 16_000, "FLOAT")],
             same_as=([(stereo.mean(axis=1), 16_000)], [])),
        Case("wav: 44,101 Hz", [_wav(tmp / "odd_rate.wav", tone(1.0, 44_101), 44_101)]),
        Case("wav: 384 kHz", [_wav(tmp / "fast.wav", tone(0.5, 384_000), 384_000)]),
        Case("wav: 999 Hz", [_wav(tmp / "slow.wav", tone(1.0, 999), 999)], error="sample rate 999 Hz is outside"),
        Case("wav: random bytes", [tmp / "noise.wav"], error="not a readable audio file"),
        Case("wav: empty file", [tmp / "empty.wav"], error="not a readable audio file"),
        Case("wav: longer than the model takes", [too_long], error=rf"{window_s + 1:.2f} s of audio.*{window_s:g} s"),
        Case("flac: cut in half", [tmp / "cut.flac"], error=r"cut\.flac: not a readable audio file"),
        Case("flac: length lies", [long_lie], error="s of audio; at most"),
        Case("flac: 20 min of silence", [bomb], error=rf"1200\.00 s of audio.*{window_s:g} s"),
    ]  # fmt: skip


OVER_PIL_BOUND = r"lying\.(png|jpg): its header declares over \d+ pixels"


def image_file_cases(tmp: Path) -> list[Case]:
    rgb = pattern(32)
    png = tmp / "good.png"
    Image.fromarray(rgb).save(png)
    jpeg = tmp / "good.jpg"
    Image.fromarray(rgb).save(jpeg, quality=95)
    rgba = np.concatenate([rgb, np.full((32, 32, 1), 128, np.uint8)], axis=2)
    Image.fromarray(rgba).save(tmp / "rgba.png")
    Image.fromarray(rgb[:, :, 0]).save(tmp / "gray.png")
    Image.new("L", (9000, 9000)).save(tmp / "bomb.png")  # 81 Mpixels of zeros: a PNG of ~80 KB
    (tmp / "cut.png").write_bytes(png.read_bytes()[:-40])
    (tmp / "cut.jpg").write_bytes(jpeg.read_bytes()[: len(jpeg.read_bytes()) // 2])
    (tmp / "noise.png").write_bytes(np.random.default_rng(1).bytes(2048))
    return [
        Case("png: RGBA", images=[tmp / "rgba.png"], same_as=([], [rgb])),
        Case("png: grayscale", images=[tmp / "gray.png"], same_as=([], [np.repeat(rgb[:, :, :1], 3, axis=2)])),
        Case("png: cut", images=[tmp / "cut.png"], error="cut.png: "),
        Case("png: decompression bomb", images=[tmp / "bomb.png"], error="9000x9000 pixels"),
        Case("png: size lies", images=[_png_header_only(tmp / "lying.png", 60_000, 60_000)], error=OVER_PIL_BOUND),
        Case("png: random bytes", images=[tmp / "noise.png"], error="noise.png: "),
        Case("jpeg: cut", images=[tmp / "cut.jpg"], error="cut.jpg: "),
        Case("jpeg: size lies", images=[_jpeg_with_size(tmp / "lying.jpg", 65_000, 65_000)], error=OVER_PIL_BOUND),
        Case("jpeg: 1x1", images=[_one_pixel(tmp / "one.jpg")]),
    ]  # fmt: skip


def _one_pixel(path: Path) -> Path:
    Image.fromarray(np.full((1, 1, 3), 200, np.uint8)).save(path)
    return path


def array_cases(window_s: float) -> list[Case]:
    mono = tone(1.0, 16_000)
    nan = mono.copy()
    nan[::7] = np.nan
    inf = mono.copy()
    inf[3] = np.inf
    frames_first = np.stack([mono, mono[::-1]], axis=1)
    longest = tone(window_s, 48_000)
    return [
        Case("array: NaN audio", [(nan, 16_000)], error="must be finite"),
        Case("array: infinite audio", [(inf, 16_000)], error="must be finite"),
        Case("array: empty audio", [(np.zeros(0, np.float32), 16_000)], error="no audio samples|empty"),
        Case("array: [frames, 2]", [(frames_first, 16_000)], same_as=([(frames_first.mean(axis=1), 16_000)], [])),
        Case("array: [2, frames]", [(frames_first.T.copy(), 16_000)], error="channels"),
        Case("array: 3-D audio", [(np.zeros((2, 2, 2), np.float32), 16_000)], error="shape"),
        Case("array: rate 0", [(mono, 0)], error="sample rate must be an int in .* got 0"),
        Case("array: rate 10**9", [(mono, 10**9)], error="sample rate must be an int in .* got 1000000000"),
        Case("array: the longest audio, 48 kHz", [(longest, 48_000)]),
        Case("array: the longest audio, 384 kHz", [(tone(window_s, 384_000), 384_000)]),
        Case("array: the largest image", images=[np.full((4096, 4096, 3), 90, np.uint8)]),
        Case("array: 5 audios", [(mono, 16_000)] * 5, error="5 audios: stage 0 takes at most 4"),
        Case("array: float image", images=[pattern(8).astype(np.float32)], error="expected uint8"),
        Case("array: RGBA image", images=[np.zeros((8, 8, 4), np.uint8)], error=r"\[height, width, 3\]"),
        Case("array: empty image", images=[np.zeros((0, 8, 3), np.uint8)], error=r"\[height, width, 3\]"),
        Case("array: 8192x8192 image", images=[np.zeros((8192, 8192, 3), np.uint8)], error="8192x8192 pixels"),
    ]  # fmt: skip

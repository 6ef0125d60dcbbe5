"""Parts of the HTTP server that need no pipeline: request schema errors in OpenAI's shape,
media decoding and its limits, PCM16/WAV encoding, incremental text with stop strings."""

from __future__ import annotations

import base64
import io

import msgspec
import numpy as np
import pytest
import soundfile

from omni_mp.config.schema import MediaLimits
from omni_mp.http.__main__ import parse_listen
from omni_mp.http.audio_out import pcm16, streaming_wav_header, wav_bytes
from omni_mp.http.detok import Detokenizer, load_tokenizer
from omni_mp.http.errors import ApiError, from_validation
from omni_mp.http.media import MediaSizes, decode_audio, decode_image
from omni_mp.http.schemas import ChatCompletionRequest
from omni_mp.stage_configs import CONFIG_DIR
from tests.synthetic_media import pattern, tone

SIZES = MediaSizes(max_media_bytes=1 << 20)
LIMITS = MediaLimits(max_audio_s=5.0, max_image_pixels=64 * 64)


def _param(body: dict) -> tuple[str | None, str | None]:
    try:
        msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)
    except msgspec.ValidationError as err:
        e = from_validation(err).body.error
        return e.param, e.code
    raise AssertionError("decoded")


def test_schema_errors_name_the_field() -> None:
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    msgspec.json.decode(msgspec.json.encode(ok), type=ChatCompletionRequest)
    assert _param({**ok, "bogus": 1}) == ("bogus", "unknown_field")
    assert _param({**ok, "temperature": 2.5}) == ("temperature", "invalid_value")
    assert _param({**ok, "top_p": 0}) == ("top_p", "invalid_value")
    assert _param({**ok, "max_tokens": 0}) == ("max_tokens", "invalid_value")
    assert _param({**ok, "stop": ["a"] * 5}) == ("stop", "invalid_value")
    bad_part = {"model": "m", "messages": [{"role": "user", "content": [{"type": "video", "video": 1}]}]}
    assert _param(bad_part)[0] == "messages[0].content[0].type"
    extra = {"model": "m", "messages": [{"role": "user", "content": "hi", "extra": 1}]}
    assert _param(extra) == ("messages[0].extra", "unknown_field")


def test_pcm16_and_wav_round_trip_through_soundfile() -> None:
    x = np.concatenate([tone(0.2, 24_000), [1.5, -1.5]]).astype(np.float32)  # the last two clip
    raw = pcm16(x)
    assert len(raw) == 2 * x.size
    got, rate = soundfile.read(io.BytesIO(wav_bytes(raw, 24_000)), dtype="int16")
    assert rate == 24_000 and np.array_equal(got, np.frombuffer(raw, dtype="<i2"))
    assert got[-2] == 32767 and got[-1] == -32767
    as_float, _ = soundfile.read(io.BytesIO(wav_bytes(raw, 24_000)), dtype="float32")
    assert np.abs(as_float[:-2] - x[:-2]).max() <= 2 / 32768
    streamed, rate = soundfile.read(io.BytesIO(streaming_wav_header(24_000) + raw), dtype="int16")
    assert rate == 24_000 and np.array_equal(streamed, got)  # a header of unknown length reads to the end


def _b64(samples: np.ndarray, rate: int, fmt: str, subtype: str) -> str:
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt, subtype=subtype)
    return base64.b64encode(buf.getvalue()).decode()


def test_input_audio_formats_data_urls_and_limits() -> None:
    x = tone(1.0)
    got, rate = decode_audio(_b64(x, 16_000, "WAV", "FLOAT"), "wav", SIZES, LIMITS, "a")
    assert rate == 16_000 and np.array_equal(got, x)
    got, _ = decode_audio("data:audio/flac;base64," + _b64(x, 16_000, "FLAC", "PCM_16"), "flac", SIZES, LIMITS, "a")
    assert np.abs(got - x).max() <= 1 / 32768
    stereo = np.stack([x, x], axis=1)
    got, _ = decode_audio(_b64(stereo, 16_000, "WAV", "FLOAT"), "wav", SIZES, LIMITS, "a")
    assert np.array_equal(got, x)
    cases = [
        (_b64(x, 16_000, "WAV", "FLOAT"), "aiff", "a.format"),
        ("not base64!", "wav", "a.data"),
        (base64.b64encode(b"RIFF nonsense").decode(), "wav", "a.data"),
        (_b64(np.zeros(16_000 * 6, np.float32), 16_000, "WAV", "PCM_16"), "wav", "a.data"),  # 6 s > 5 s
        (_b64(np.zeros(600_000, np.float32), 16_000, "WAV", "PCM_16"), "wav", "a.data"),  # 1.2 MB > 1 MiB
    ]
    for data, fmt, param in cases:
        with pytest.raises(ApiError) as raised:
            decode_audio(data, fmt, SIZES, LIMITS, "a")
        assert raised.value.status == 400 and raised.value.body.error.param == param


def test_images_only_as_data_urls_within_the_pixel_limit() -> None:
    from PIL import Image

    def url(pixels: np.ndarray) -> str:
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    assert np.array_equal(decode_image(url(pattern(56)), SIZES, LIMITS, "i"), pattern(56))
    for bad in [
        "https://example.com/cat.png",
        url(pattern(65)),
        "data:image/png;base64," + base64.b64encode(b"x").decode(),
    ]:
        with pytest.raises(ApiError) as raised:
            decode_image(bad, SIZES, LIMITS, "i")
        assert raised.value.status == 400 and raised.value.body.error.param == "i"


def test_incremental_text_equals_the_full_decode_and_cuts_at_stop_strings() -> None:
    tok = load_tokenizer("tiny-qwen2_5-omni")
    text = "Hello there, general Kenobi. You are a bold one."
    ids = tok.encode(text)
    d = Detokenizer(tok, [])
    parts = [d.add([i]) for i in ids]
    assert "".join(parts) == tok.decode(ids) and sum(bool(p) for p in parts) > 1
    for text in ["héllo wörld, 日本語のテキスト 😀👍🏽 done", "  spaces   and\n\nnewlines "]:
        ids = tok.encode(text)
        d = Detokenizer(tok, [])
        assert "".join(d.add([i]) for i in ids) == tok.decode(ids)
    rng = np.random.default_rng(0)  # what a random-weight model writes: any ids, bytes cut anywhere
    ids = rng.integers(0, len(tok), 300).tolist()
    d = Detokenizer(tok, [])
    streamed = "".join(d.add([i]) for i in ids)
    assert tok.decode(ids).startswith(streamed)
    assert streamed + d.add([], final_text=tok.decode(ids)) == tok.decode(ids)
    ids = tok.encode("Hello there, general Kenobi. You are a bold one.")
    d = Detokenizer(tok, ["Kenobi"])
    out = "".join(d.add([i]) for i in ids)
    assert d.stopped and out == tok.decode(ids)[: tok.decode(ids).index("Kenobi")]
    d = Detokenizer(tok, ["never there"])
    assert "".join(d.add([i]) for i in ids) + d.add([], final_text=tok.decode(ids)) == tok.decode(ids)


def test_listen_spec() -> None:
    assert parse_listen("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert parse_listen("[::1]:80") == ("::1", 80)
    for bad in ["8000", "host:", ":80", "h:99999"]:
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_a_request_runs_in_its_final_stages_and_their_upstream() -> None:
    from omni_mp.config.validate import load_config
    from omni_mp.control.requests import Rejected, check_submit, request_stages
    from omni_mp.wire.messages import Submit

    cfg = load_config(CONFIG_DIR / "tiny_qwen2_5_omni.yaml")  # 0 -> 1 -> 2, all final
    assert request_stages(cfg, {0}) == {0}
    assert request_stages(cfg, {1}) == {0, 1}
    assert request_stages(cfg, {2}) == {0, 1, 2}
    check_submit(cfg, Submit(request_id="r", prompt="hi", final_stages=[0]))
    for bad, why in [([3], "not a final stage"), ([0, 0], "given twice")]:
        with pytest.raises(Rejected, match=why):
            check_submit(cfg, Submit(request_id="r", prompt="hi", final_stages=bad))

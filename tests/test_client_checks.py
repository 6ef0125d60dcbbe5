"""The client never hangs silently and never lets a library's error through (issue 23):

- a CURVE handshake that fails (no keys, keys not listed, a wrong server key, keys against an
  endpoint without CURVE) raises HandshakeError within seconds, naming the endpoint, and the
  coordinator logs it; a stage id the pipeline lacks is an InvalidRequest (a ValueError);
- a request on an endpoint where nothing listens fails after `connect_timeout_s`, naming it;
- every bad argument is a ValueError naming it (and the file) before anything is sent;
- multi-channel audio: [samples, channels] is down-mixed to the mean of its channels,
  anything else ([channels, samples] included) is refused with its shape, never reshaped.

Real sockets throughout; the keyed pipeline (one real stage process) is test_curve_pipeline's."""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from omni_mp.client.media import MAX_CHANNELS, audio_samples, multi_modal_input
from omni_mp.client.omni_client import HandshakeError, InvalidRequest, OmniClient, RequestError
from omni_mp.control.coordinator import Coordinator
from omni_mp.wire.codec import decode, encode
from omni_mp.wire.keys import CurveIdentity, client_identity, generate
from omni_mp.wire.messages import ErrorEvent, SamplingParamsMsg
from tests.test_audio_io import _broken_files, sine
from tests.test_curve_pipeline import secured  # noqa: F401  (the keyed pipeline fixture)


def _nowhere() -> str:
    return f"ipc://@omni_mp-test-nothing-{uuid.uuid4().hex}"


def _raises_within(seconds: float, error: type[Exception], call: Any) -> Exception:
    start = time.monotonic()
    with pytest.raises(error) as info:
        call()
    elapsed = time.monotonic() - start
    assert elapsed <= seconds, f"{error.__name__} after {elapsed:.1f}s: {info.value}"
    return info.value


# ---- no silent hang ---------------------------------------------------------------------


def test_nothing_listening_times_out_naming_the_endpoint() -> None:
    endpoint = _nowhere()
    with OmniClient(endpoint, connect_timeout_s=1.0) as client:
        calls = {
            "generate": lambda: client.generate("Hello"),
            "stream": lambda: next(client.stream("Hello")),
            "status": lambda: client.status(timeout_s=30),
        }
        for name, call in calls.items():
            start = time.monotonic()
            err = _raises_within(3.0, TimeoutError, call)
            assert time.monotonic() - start >= 0.9, name
            assert endpoint in str(err) and "connect_timeout_s" in str(err), (name, err)
        # status()'s own timeout applies when shorter.
        err = _raises_within(0.8, TimeoutError, lambda: client.status(timeout_s=0.3))
        assert endpoint in str(err)


def test_keys_against_an_endpoint_without_curve_fail_at_once(tmp_path: Path) -> None:
    generate(tmp_path / "keys", ["alice"])
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = _nowhere()
    router.bind(endpoint)
    try:
        with OmniClient(endpoint, keys=client_identity(tmp_path / "keys", "alice")) as client:
            err = _raises_within(5.0, HandshakeError, lambda: client.generate("Hello"))
            assert endpoint in str(err) and "does not use CURVE" in str(err), err
            assert not router.poll(0), "a message went through a failed handshake"
    finally:
        router.close()
        ctx.term()


def test_a_lost_connection_fails_what_is_in_flight_after_the_answers_already_sent() -> None:
    """A scripted coordinator (a real ROUTER) answers the first request with an error, leaves
    the second unanswered, then closes: the first gets its error, the second a ConnectionError."""
    endpoint = _nowhere()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    errors: dict[str, BaseException] = {}
    try:
        with OmniClient(endpoint, connect_timeout_s=5) as client:

            def run(rid: str) -> None:
                try:
                    client.generate("Hello", request_id=rid)
                except Exception as err:  # noqa: BLE001
                    errors[rid] = err

            threads = [threading.Thread(target=run, args=(rid,)) for rid in ("answered", "lost")]
            for t in threads:
                t.start()
            seen = []
            while len(seen) < 2:
                assert router.poll(5000), "the client sent nothing"
                ident, *frames = router.recv_multipart()
                seen.append(decode(frames).request_id)
            answer = ErrorEvent(request_id="answered", stage_id=None, code="shutdown", message="going away")
            router.send_multipart([ident, *encode(answer)])
            router.close(linger=1000)  # the answer goes out, then the connection closes
            start = time.monotonic()
            for t in threads:
                t.join(10)
            assert time.monotonic() - start <= 3.0
    finally:
        ctx.term()
    assert isinstance(errors["answered"], RequestError) and errors["answered"].code == "shutdown", errors
    lost = errors["lost"]
    assert isinstance(lost, ConnectionError) and endpoint in str(lost) and "connection lost" in str(lost), errors


def _wrong_server_key(keys: Path, other: Path) -> CurveIdentity:
    """alice's own keypair, with the server key of another key directory."""
    generate(other, [])
    alice, stranger = client_identity(keys, "alice"), client_identity(other, "internal")
    return CurveIdentity(alice.public, alice.secret, stranger.server_public)


@pytest.mark.engine
def test_failed_handshakes_raise_within_seconds_and_are_logged(
    secured: tuple[Coordinator, Path],  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    coord, keys = secured
    endpoint = coord.client_endpoint
    caplog.set_level(logging.WARNING, logger="omni_mp.control.links")
    cases: dict[str, tuple[CurveIdentity | None, str]] = {
        "no keys": (None, "omni-mp keys DIR --client NAME"),
        "unlisted": (client_identity(keys, "mallory"), "not in the pipeline's DIR/clients/"),
        "wrong server key": (_wrong_server_key(keys, tmp_path / "other"), "handshake failed"),
    }
    for case, (identity, hint) in cases.items():
        with OmniClient(endpoint, keys=identity) as client:
            for call in (lambda: client.status(), lambda: client.generate("Hello"), lambda: next(client.stream("Hi"))):
                err = _raises_within(5.0, HandshakeError, call)
                assert endpoint in str(err) and "CURVE handshake failed" in str(err) and hint in str(err), (case, err)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("handshake failed" in r.getMessage() for r in caplog.records):
        time.sleep(0.1)
    assert any(endpoint in r.getMessage() and "handshake failed" in r.getMessage() for r in caplog.records)
    # The pipeline still serves its listed client, and refuses a stage id it lacks by name.
    with OmniClient(endpoint, keys=client_identity(keys, "alice")) as alice:
        assert len(alice.generate("Hello", timeout_s=60).outputs[0].token_ids) == 8
        with pytest.raises(InvalidRequest) as info:
            alice.generate("Hello", sampling={7: SamplingParamsMsg(max_tokens=2)}, timeout_s=60)
        assert isinstance(info.value, ValueError) and "`sampling`" in str(info.value) and "7" in str(info.value)


# ---- arguments ----------------------------------------------------------------------------


def _argument_cases(tmp_path: Path) -> list[tuple[dict[str, Any], str]]:
    """(keyword arguments of generate(), what the error must name)."""
    broken = _broken_files(tmp_path)
    (tmp_path / "not_an_image.png").write_bytes(b"no pixels here")
    nan = np.full(1600, np.nan, dtype=np.float32)
    tone = sine(440, 16_000, 0.1)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"audios": [(np.zeros(0, dtype=np.float32), 16_000)]}, "audios[0]: no audio samples"),
        ({"audios": [(torch.zeros(0), 16_000)]}, "audios[0]: no audio samples"),
        ({"audios": [(nan, 16_000)]}, "audios[0]: samples must be finite"),
        ({"audios": [(tone, 16_000.0)]}, "audios[0]: sample rate"),
        ({"audios": [(tone, 10)]}, "audios[0]: sample rate"),
        ({"audios": [(tone, 16_000), tone]}, "audios[1]"),
        ({"audios": [(["a", "b"], 16_000)]}, "audios[0]: samples must be an array of numbers"),
        ({"audios": str(broken["cut_in_fmt.wav"])}, "`audios` must be a list"),
        ({"images": [np.zeros((4, 4, 3), dtype=np.float32)]}, "images[0]: expected uint8 [height, width, 3]"),
        ({"images": [np.zeros((4, 4), dtype=np.uint8)]}, "images[0]: expected uint8 [height, width, 3]"),
        ({"images": [torch.zeros(3, 4, 4, dtype=torch.uint8)]}, "images[0]: expected uint8 [height, width, 3]"),
        ({"images": [np.zeros((0, 4, 3), dtype=np.uint8)]}, "images[0]: expected uint8 [height, width, 3]"),
        ({"images": [tmp_path / "not_an_image.png"]}, f"images[0]: {tmp_path / 'not_an_image.png'}"),
        ({"images": [tmp_path / "missing.png"]}, f"images[0]: {tmp_path / 'missing.png'}: no such file"),
        ({"sampling": {0: SamplingParamsMsg(temperature=-1.0)}}, "`sampling[0]`: Expected `float` >= 0.0"),
        ({"sampling": {0: {"top_p": 0.0}}}, "`sampling[0]`: Expected `float` > 0.0"),
        ({"sampling": {0: SamplingParamsMsg(temperature=float("nan"))}}, "`sampling[0]`"),
        ({"sampling": {0: {"bogus": 1}}}, "`sampling[0]`: Object contains unknown field"),
        ({"sampling": {-1: SamplingParamsMsg()}}, "`sampling`: stage ids are ints >= 0"),
        ({"sampling": {"0": SamplingParamsMsg()}}, "`sampling`: stage ids are ints >= 0"),
        ({"sampling": [SamplingParamsMsg()]}, "`sampling` must map stage ids"),
        ({"prompt": ""}, "`prompt` must be a non-empty string"),
        ({"prompt": None}, "give exactly one of `prompt`"),
        ({"prompt": None, "prompt_token_ids": [1, -2]}, "`prompt_token_ids`: token ids are ints >= 0"),
        ({"prompt": None, "prompt_token_ids": []}, "`prompt_token_ids` must be a non-empty list"),
        ({"prompt": None, "prompt_embeds": np.zeros((0, 8), dtype=np.float32)}, "`prompt_embeds`: expected floating"),
        ({"prompt": None, "prompt_embeds": torch.zeros(4, 8, dtype=torch.int32)}, "`prompt_embeds`: expected floating"),
        ({"prompt": None, "prompt_embeds": [[0.0] * 8]}, "`prompt_embeds` must be a numpy array"),
        ({"deadline_s": 0}, "`deadline_s` must be a finite number"),
        ({"timeout_s": float("nan")}, "`timeout_s` must be a finite number"),
        ({"request_id": ""}, "`request_id` must be a non-empty string"),
        ({"speaker": 3}, "`speaker` must be a non-empty string"),
        ({"forced_reply": " "}, "`forced_reply` must be a non-empty string"),
        ({"prompt": None, "prompt_token_ids": [1, 2], "forced_reply": "Hi"}, "`forced_reply` follows a text `prompt`"),
    ]
    for name in ("cut_in_fmt.wav", "header_only.wav", "channels_65535.wav", "nan.wav", "missing"):
        cases.append(({"audios": [broken[name]]}, f"audios[0]: {broken[name]}: "))
    return cases


def test_every_bad_argument_is_a_value_error_naming_it(tmp_path: Path) -> None:
    # Nothing listens: an argument that got past the checks would wait out the connect timeout.
    with OmniClient(_nowhere(), connect_timeout_s=30) as client:
        for kwargs, named in _argument_cases(tmp_path):
            args = {"prompt": "Hello", **kwargs}
            for call in (lambda a=args: client.generate(**a), lambda a=args: next(client.stream(**a))):
                err = _raises_within(2.0, InvalidRequest, call)
                assert isinstance(err, ValueError) and err.code == "invalid_input", repr(err)
                assert named in str(err), (kwargs, str(err))
                # The check that refused it is ours, not a library's error passed on.
                origin = err.__context__
                assert isinstance(origin, ValueError) and origin.__cause__ is None, (kwargs, repr(origin))
                raised_in = traceback.extract_tb(origin.__traceback__)[-1].filename
                assert "/omni_mp/" in raised_in, (kwargs, repr(origin), raised_in)
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="`connect_timeout_s`"):
            OmniClient(_nowhere(), connect_timeout_s=bad)


# ---- multi-channel audio ----------------------------------------------------------------


def test_channels_last_is_down_mixed_to_the_mean_of_its_channels() -> None:
    left, right = sine(440, 16_000, 0.25), sine(660, 16_000, 0.25, amplitude=0.2)
    stereo = np.stack([left, right], axis=1)  # [samples, 2]
    expected = (left + right) / 2
    for given in (stereo, torch.from_numpy(stereo), stereo.astype(np.float64)):
        mm = multi_modal_input(audios=[(given, 16_000)])
        assert mm is not None
        got = np.asarray(mm.audios[0].samples)
        assert got.dtype == np.float32 and got.shape == (left.size,)
        np.testing.assert_allclose(got, expected, atol=1e-6)
    same = np.stack([left] * MAX_CHANNELS, axis=1)  # equal channels: the mono signal itself
    np.testing.assert_allclose(audio_samples(same, "a"), left, atol=1e-6)
    np.testing.assert_array_equal(audio_samples(left[:, None], "a"), left)


def test_other_layouts_are_refused_with_their_shape_never_reshaped() -> None:
    n = 4000
    refused = {
        "[channels, samples]": (np.zeros((2, n), dtype=np.float32), "looks like [channels, samples]"),
        "torch [channels, samples]": (torch.zeros(2, n), "looks like [channels, samples]"),
        "too many channels": (np.zeros((n, MAX_CHANNELS + 1), dtype=np.float32), f"at most {MAX_CHANNELS} channels"),
        "ambiguous": (np.zeros((4, 4), dtype=np.float32), f"at most {MAX_CHANNELS} channels"),
        "3-D": (np.zeros((1, n, 2), dtype=np.float32), f"at most {MAX_CHANNELS} channels"),
    }
    for case, (samples, why) in refused.items():
        with pytest.raises(ValueError) as info:
            multi_modal_input(audios=[(samples, 16_000)])
        msg = str(info.value)
        assert msg.startswith("audios[0]: ") and why in msg and str(list(samples.shape)) in msg, (case, msg)

"""Images out of the tiny Qwen-Image pipeline (omni_mp/stage_configs/tiny_qwen_image.yaml, CPU) through
every front end: one real launcher serving ZMQ and `--http`, the ZMQ client
(`generate_image`, `stream_images`), the HTTP server driven by the official `openai` client
(`client.images.generate`: b64_json PNGs, n, size, seed and the diffusion extras, SSE), and the
CLI writing PNGs and JSON records. The image of a request is fixed by its prompt and params
(seed included), so every front end must give the ZMQ client's pixels exactly (PNG is
lossless; decoded here by Pillow) when it runs the request alone, and within 1/255 when it
may share steps with a prompt of another length (the CLI's two prompts). That image itself is
checked against diffusers by the family's own oracle tests (tests/test_qwen_image_*.py)."""

from __future__ import annotations

import base64
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.models.registry import makes_images
from omni_mp.stage_configs import CONFIG_DIR
from tests.launcher import (
    ServedPipeline,
    check_shipped_run,
    config_args,
    run_cli,
    serve,
    settled_client,
    wait_healthy,
)

pytestmark = pytest.mark.engine
# The HTTP server and the CLI know an image stage by its family's word (Family.image_models).
DECLARED = makes_images("qwen_image")
needs_declared = pytest.mark.skipif(
    not DECLARED,
    reason="the qwen_image family does not declare its DiT in `image_models` "
    "(omni_mp/models/qwen_image/__init__.py: FAMILY(..., image_models=frozenset({'qwen_image'})))",
)

CONFIG = CONFIG_DIR / "tiny_qwen_image.yaml"
KEY = "image-key"
W, H, STEPS = 64, 48, 3  # not square: width and height must not be swapped anywhere
PROMPT = "a red fox in the snow"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, pipeline: ServedPipeline, url: str) -> None:
        self.pipeline = pipeline
        self.url = url
        self.openai = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    url = f"http://127.0.0.1:{_free_port()}"
    http = ["--http", url.removeprefix("http://"), "--api-key", KEY] if DECLARED else []
    with serve(CONFIG, *http) as pipeline:
        if DECLARED:
            wait_healthy(url, pipeline)
        yield Served(pipeline, url)


@pytest.fixture
def zmq(served: Served) -> Iterator[OmniClient]:
    with settled_client(served.pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


def params(seed: int, **extra: object) -> dict[str, object]:
    return {"width": W, "height": H, "num_inference_steps": STEPS, "seed": seed, **extra}


def _png(b64: str) -> np.ndarray:
    with Image.open(io.BytesIO(base64.b64decode(b64))) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        return np.asarray(im)


def test_the_client_returns_uint8_hw3_fixed_by_the_seed(zmq: OmniClient) -> None:
    a = zmq.generate_image(PROMPT, params=params(5))
    assert isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.shape == (H, W, 3)
    assert a.std() > 0  # a picture, not a constant
    assert np.array_equal(zmq.generate_image(PROMPT, params=params(5)), a)
    assert not np.array_equal(zmq.generate_image(PROMPT, params=params(6)), a)
    done = zmq.generate(PROMPT, params=params(5))  # the same image in Finished, as the stage made it
    image = next(o.image for o in done.outputs if o.image is not None)
    assert np.array_equal(np.asarray(image), a)
    chunks = list(zmq.stream_images(PROMPT, params=params(5)))
    assert chunks[-1].step is None and np.array_equal(chunks[-1].pixels, a)
    assert all(c.step is not None for c in chunks[:-1])  # previews only before it (none asked for here)


def test_previews_stream_before_the_image(zmq: OmniClient) -> None:
    """`preview_every` 1 over 3 steps: the latents decoded after steps 1 and 2, then the image,
    which previews leave unchanged."""
    chunks = list(zmq.stream_images(PROMPT, params=params(5, preview_every=1)))
    assert [c.step for c in chunks] == [1, 2, None]
    for c in chunks:
        assert c.pixels.dtype == np.uint8 and c.pixels.shape == (H, W, 3)
    assert not np.array_equal(chunks[0].pixels, chunks[1].pixels)
    assert np.array_equal(chunks[-1].pixels, zmq.generate_image(PROMPT, params=params(5)))
    stream = zmq.stream_images(PROMPT, params=params(6, preview_every=1))
    assert next(stream).step == 1
    stream.close()  # leaving early aborts the request (settled_client checks nothing stays in flight)


def test_bad_params_fail_that_request_only(zmq: OmniClient) -> None:
    with pytest.raises(RequestError) as err:
        zmq.generate_image(PROMPT, params=params(1, width=65))
    assert err.value.code == "invalid_input" and "multiple of 16" in str(err.value)
    with pytest.raises(RequestError, match="unknown field|bogus") as err:
        zmq.generate_image(PROMPT, params={**params(1), "bogus": 1})
    with pytest.raises(ValueError, match="params"):  # refused by the client before anything is sent
        zmq.generate_image(PROMPT, params={"seed": [1, 2]})  # type: ignore[dict-item]
    assert zmq.generate_image(PROMPT, params=params(1)).shape == (H, W, 3)


@needs_declared
def test_openai_images_generate_gives_the_clients_pixels(served: Served, zmq: OmniClient) -> None:
    res = served.openai.images.generate(
        model="tiny", prompt=PROMPT, n=2, size=f"{W}x{H}", response_format="b64_json",
        extra_body={"seed": 5, "num_inference_steps": STEPS},
    )  # fmt: skip
    assert len(res.data) == 2 and res.size == f"{W}x{H}"
    seeds = [d.model_extra["seed"] for d in res.data]  # type: ignore[index]
    assert seeds == [5, 6]  # image i of n gets seed + i
    for d, seed in zip(res.data, seeds, strict=True):
        assert np.array_equal(_png(d.b64_json), zmq.generate_image(PROMPT, params=params(seed)))
    # no seed: one is drawn and returned, and it makes the same image again
    res = served.openai.images.generate(prompt=PROMPT, size=f"{W}x{H}", extra_body={"num_inference_steps": STEPS})
    seed = res.data[0].model_extra["seed"]  # type: ignore[index]
    assert np.array_equal(_png(res.data[0].b64_json), zmq.generate_image(PROMPT, params=params(seed)))


@needs_declared
def test_true_cfg_extras_reach_the_dit(served: Served, zmq: OmniClient) -> None:
    extra = {"seed": 3, "num_inference_steps": STEPS, "negative_prompt": "blurry", "true_cfg_scale": 4.0}
    res = served.openai.images.generate(prompt=PROMPT, size=f"{W}x{H}", extra_body=extra)
    got = _png(res.data[0].b64_json)
    want = zmq.generate_image(PROMPT, params=params(3, negative_prompt="blurry", true_cfg_scale=4.0))
    assert np.array_equal(got, want)
    assert not np.array_equal(got, zmq.generate_image(PROMPT, params=params(3)))  # CFG changed the image


@needs_declared
def test_streamed_images_end_with_the_image(served: Served, zmq: OmniClient) -> None:
    events = list(
        served.openai.images.generate(
            prompt=PROMPT, size=f"{W}x{H}", stream=True, extra_body={"seed": 8, "num_inference_steps": STEPS}
        )
    )
    assert events[-1].type == "image_generation.completed"
    assert all(e.type == "image_generation.partial_image" for e in events[:-1])
    assert np.array_equal(_png(events[-1].b64_json), zmq.generate_image(PROMPT, params=params(8)))


@needs_declared
def test_partial_images_stream_as_openai_events(served: Served, zmq: OmniClient) -> None:
    events = list(
        served.openai.images.generate(
            prompt=PROMPT, size=f"{W}x{H}", stream=True, partial_images=2,
            extra_body={"seed": 9, "num_inference_steps": STEPS},
        )
    )  # fmt: skip
    assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    assert [e.model_extra["step"] for e in events[:2]] == [1, 2]  # type: ignore[index]
    previews = list(zmq.stream_images(PROMPT, params=params(9, preview_every=1)))
    for e, want in zip(events, previews, strict=True):
        assert np.array_equal(_png(e.b64_json), want.pixels)


@needs_declared
def test_refusals_name_the_field_and_the_server_keeps_serving(served: Served) -> None:
    cases = [
        ({"response_format": "url"}, "response_format", "b64_json"),
        ({"size": "64by48"}, "size", "WIDTHxHEIGHT"),
        ({"size": "65x48"}, None, "multiple of 16"),  # the stage's refusal, as a 400
        ({"n": 11}, "n", ""),
        ({"quality": "hd"}, "quality", ""),
        ({"extra_body": {"guidance": 3}}, "guidance", "unknown"),
    ]
    for kwargs, param, text in cases:
        with pytest.raises(openai.BadRequestError) as err:
            served.openai.images.generate(prompt=PROMPT, **kwargs)  # type: ignore[arg-type]
        body = err.value.body
        assert isinstance(body, dict), body
        if param is not None:
            assert body.get("param") == param, body
        assert text in body["message"], body
    with pytest.raises(openai.BadRequestError, match="does not chat"):
        served.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="wrong", max_retries=0).images.generate(prompt=PROMPT)
    res = served.openai.images.generate(prompt=PROMPT, size=f"{W}x{H}", extra_body={"num_inference_steps": STEPS})
    assert _png(res.data[0].b64_json).shape == (H, W, 3)


@needs_declared
def test_cli_writes_one_png_per_request_with_size_and_seed(served: Served, tmp_path: Path) -> None:
    written = tmp_path / "out"
    proc = run_cli(
        *config_args(CONFIG.stem), "--prompt", PROMPT, "--prompt", "a blue boat",
        "--size", f"{W}x{H}", "--steps", str(STEPS), "--seed", "40", "--output-dir", str(written), cwd=tmp_path,
    )  # fmt: skip
    check_shipped_run(CONFIG.stem, proc, written, requests=2)  # as tests/test_shipped_configs.py would run it
    with settled_client(served.pipeline.endpoint) as zmq:
        for i, prompt in enumerate([PROMPT, "a blue boat"]):
            record = json.loads((written / f"req{i}.json").read_text())
            assert record["prompt"] == prompt
            (image,) = record["images"].values()
            assert image == {"width": W, "height": H, "seed": 40 + i, "file": f"req{i}.png"}
            assert all("image" not in out for out in record["outputs"])  # the pixels are in the PNG only
            with Image.open(written / image["file"]) as im:
                assert im.format == "PNG" and im.size == (W, H)
                got = np.asarray(im).astype(np.int16)
            # The CLI's two prompts may share denoising steps (and the encoder's prefill batch),
            # and a batched call may round differently from a solo one (equal on this 2-core
            # machine, not on the CI machine): the image is fixed by prompt and seed within the
            # 1/255 the diffusers oracle allows, and a seed apart is far more.
            want = zmq.generate_image(prompt, params=params(40 + i)).astype(np.int16)
            assert np.abs(got - want).max() <= 1
            other = zmq.generate_image(prompt, params=params(50 + i)).astype(np.int16)
            assert np.abs(got - other).max() > 8
    assert f"{W}x{H} image, seed 40" in proc.stdout

"""`/v1/images/generations` parts that need no pipeline: the request schema, what is refused
(and with which `param`), how OpenAI's fields map onto the image stage's params, and chat
refused by a pipeline that makes images only."""

from __future__ import annotations

import msgspec
import pytest

from omni_mp.config.validate import parse_config
from omni_mp.http.audio_ids import MemoryAudioStore
from omni_mp.http.chat import ChatContext, parse_chat
from omni_mp.http.errors import ApiError, from_validation
from omni_mp.http.images import parse_images
from omni_mp.http.media import MediaSizes
from omni_mp.http.pipeline import PipelineView
from omni_mp.http.schemas import ChatCompletionRequest, ImageGenerationRequest
from omni_mp.media.image_io import parse_size

CHAIN = parse_config(
    {
        "name": "chain",
        "stages": [
            {"id": 0, "model": "tiny-qwen2"},
            {"id": 1, "model": "tiny-qwen2", "inputs": [0], "processor": "continue_tokens", "final_output": True},
        ],
    },
    check_engine_args=False,
)
TEXT_VIEW = PipelineView.of(CHAIN)
# The image stage as the view holds it (which stage it is is all the parsing reads).
IMAGE_VIEW = PipelineView(CHAIN, text_stage=None, audio_stage=None, image_stage=CHAIN.stages[1])


def _req(**body: object) -> ImageGenerationRequest:
    return msgspec.json.decode(msgspec.json.encode({"prompt": "a red fox", **body}), type=ImageGenerationRequest)


def _refused(**body: object) -> tuple[str | None, str | None, str]:
    try:
        parse_images(_req(**body), IMAGE_VIEW)
    except ApiError as err:
        e = err.body.error
        assert err.status == 400
        return e.param, e.code, e.message
    raise AssertionError(f"accepted: {body}")


def test_openai_fields_and_extras_map_onto_the_image_params() -> None:
    job = parse_images(
        _req(n=3, size="768x512", seed=11, num_inference_steps=20, true_cfg_scale=4.0, negative_prompt=" "),
        IMAGE_VIEW,
    )
    assert (job.prompt, job.n, job.seed, job.stream) == ("a red fox", 3, 11, False)
    assert job.params == {"width": 768, "height": 512, "num_inference_steps": 20, "true_cfg_scale": 4.0,
                          "negative_prompt": " "}  # fmt: skip
    plain = parse_images(_req(size="auto", response_format="b64_json", output_format="png"), IMAGE_VIEW)
    assert plain.params == {} and plain.n == 1 and 0 <= plain.seed < 2**31 - 1024  # a seed drawn for it
    streamed = parse_images(_req(stream=True, partial_images=3, num_inference_steps=20), IMAGE_VIEW)
    assert streamed.stream and streamed.partial_images == 3 and streamed.params["preview_every"] == 5
    for steps, partial, every in ((20, 2, 7), (3, 2, 1), (10, 3, 3), (5, 3, 2), (1, 1, 1)):
        job = parse_images(_req(stream=True, partial_images=partial, num_inference_steps=steps), IMAGE_VIEW)
        assert job.params["preview_every"] == every
        assert len(range(every, steps, every)) <= partial  # previews after steps every, 2 every, ... (not the last)


def test_what_is_refused_names_its_field() -> None:
    for size in ("1024", "1024x", "x1024", "1024*1024", "0x512", "512x99999", "-512x512", "abc"):
        param, code, message = _refused(size=size)
        assert param == "size" and size in message, message
    param, code, message = _refused(response_format="url")
    assert (param, code) == ("response_format", "unsupported_value") and "b64_json" in message
    assert _refused(output_format="jpeg")[:2] == ("output_format", "unsupported_value")
    assert _refused(quality="hd")[:2] == ("quality", "unsupported_value")
    assert _refused(style="vivid")[:2] == ("style", "unsupported_value")
    assert _refused(background="transparent")[:2] == ("background", "unsupported_value")
    assert _refused(stream=True, n=2)[:2] == ("n", "unsupported_value")
    assert _refused(partial_images=2)[0] == "partial_images"
    assert _refused(stream=True, partial_images=2)[0] == "num_inference_steps"
    with pytest.raises(ApiError, match="makes no images"):
        parse_images(_req(), TEXT_VIEW)


def test_schema_errors_name_the_field() -> None:
    def param(body: dict) -> tuple[str | None, str | None]:
        try:
            msgspec.json.decode(msgspec.json.encode({"prompt": "p", **body}), type=ImageGenerationRequest)
        except msgspec.ValidationError as err:
            e = from_validation(err).body.error
            return e.param, e.code
        raise AssertionError("decoded")

    assert param({"n": 0}) == ("n", "invalid_value")
    assert param({"n": 11}) == ("n", "invalid_value")
    assert param({"prompt": ""}) == ("prompt", "invalid_value")
    assert param({"seed": -1}) == ("seed", "invalid_value")
    assert param({"num_inference_steps": 0}) == ("num_inference_steps", "invalid_value")
    assert param({"true_cfg_scale": -1}) == ("true_cfg_scale", "invalid_value")
    assert param({"partial_images": 4}) == ("partial_images", "invalid_value")
    assert param({"guidance": 3}) == ("guidance", "unknown_field")


def test_parse_size() -> None:
    assert parse_size("1024x768") == (1024, 768)
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        parse_size("1024 x 768")


def test_a_pipeline_that_only_makes_images_refuses_chat() -> None:
    req = msgspec.json.decode(
        msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), type=ChatCompletionRequest
    )
    with pytest.raises(ApiError, match="does not chat") as err:
        store = MemoryAudioStore(max_entries=1, max_bytes=1, ttl_s=1)
        parse_chat(req, ChatContext(IMAGE_VIEW, MediaSizes(max_media_bytes=1 << 20), None, store))
    assert err.value.status == 400 and err.value.body.error.param == "model"

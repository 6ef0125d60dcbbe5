"""Qwen-Image text to image end to end (omni_mp/stage_configs/tiny_qwen_image.yaml, with stage 0 also a
final stage so that its hidden rows reach the client): a real launcher process, the text
encoder on vLLM (stage 0, prefill-only, the negative prompt as a companion sequence) and the
DiT on the diffusion kind (stage 1), a raw ZMQ client sending `Submit.params`. The oracle is
diffusers' `QwenImagePipeline` on the same tiny checkpoint (fp32, same seed).

Measured: the encoder's rows (template dropped) equal diffusers' prompt embeddings within
1.4e-6 (asserted 1e-5), the mask is all ones over exactly diffusers' valid tokens; images
within 1/255 per pixel.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import torch
import yaml

from omni_mp.models.qwen_image.params import ImageParams
from omni_mp.models.qwen_image.prompt import TEMPLATE_DROP
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import IMAGE_KEY, ErrorEvent, Finished, StageOutputChunk, Submit
from tests.diffusers_oracle import diffusers_image
from tests.launcher import ServedPipeline, serve
from tests.rawclient import RawClient

pytestmark = pytest.mark.engine

CONFIG = CONFIG_DIR / "tiny_qwen_image.yaml"
EMBED_ATOL = 1e-5
PIXEL_ATOL = 1 / 255 + 1e-6


@pytest.fixture(scope="module")
def ckpt() -> str:
    return str(resolve_model("tiny-qwen-image"))


@pytest.fixture(scope="module")
def pipe(ckpt: str) -> Any:
    from diffusers import QwenImagePipeline

    return QwenImagePipeline.from_pretrained(ckpt, dtype=torch.float32)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedPipeline]:
    data = yaml.safe_load(CONFIG.read_text())
    data["stages"][0]["final_output"] = True  # the encoder's rows go to the client too
    config = tmp_path_factory.mktemp("qwen_image") / "pipeline.yaml"
    config.write_text(yaml.safe_dump(data))
    with serve(config) as served:
        yield served


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[RawClient]:
    c = RawClient(pipeline.endpoint)
    yield c
    c.close()


def submit(c: RawClient, rid: str, prompt: str, p: ImageParams | dict[str, Any], rows: bool = False) -> None:
    params = p if isinstance(p, dict) else msgspec.to_builtins(p)
    c.send(Submit(request_id=rid, prompt=prompt, params=params, stream=True, deadline_s=300, hidden_states=rows))


def image_of(c: RawClient, rid: str) -> torch.Tensor:
    done = c.wait_terminal(rid, 300)
    assert isinstance(done, Finished), done
    chunks = [e for e in c.events[rid] if isinstance(e, StageOutputChunk) and e.additional_information]
    assert len(chunks) == 1 and chunks[0].stage_id == 1
    return chunks[0].additional_information[IMAGE_KEY]  # type: ignore[index]


def assert_image(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == torch.uint8 and tuple(got.shape) == tuple(ref.shape)
    diff = (got.float() / 255 - ref).abs().max().item()
    assert diff <= PIXEL_ATOL, f"image differs by {diff * 255:.2f}/255"


def test_encoder_rows_match_diffusers_prompt_embeddings(client: RawClient, pipe: Any) -> None:
    """Stage 0's rows of the prompt and of a negative prompt of another length (one request,
    two sequences), each after the template's drop, vs diffusers' prompt embeddings and mask."""
    prompt, negative = "a red cube on a blue table, next to a small cat", "blurry"
    p = ImageParams(height=32, width=32, num_inference_steps=2, seed=0, negative_prompt=negative)
    submit(client, "rows", prompt, p, rows=True)  # stage 0 is final: its rows come to us when asked
    assert isinstance(client.wait_terminal("rows", 300), Finished)
    enc = [e for e in client.events["rows"] if isinstance(e, StageOutputChunk) and e.stage_id == 0]
    assert len(enc) == 1 and enc[0].finished and enc[0].hidden is not None and enc[0].prompt_token_ids
    n, rows = len(enc[0].prompt_token_ids), enc[0].hidden.last
    for text, got in ((prompt, rows[TEMPLATE_DROP:n]), (negative, rows[n + TEMPLATE_DROP :])):
        # Two prompts of different lengths in one diffusers batch: right-padded, with a mask.
        embeds, mask = pipe._get_qwen_prompt_embeds([text, "x " * 30])
        valid = int(mask[0].sum())
        assert mask[0, :valid].all() and not mask[0, valid:].any()
        assert got.shape == (valid, embeds.shape[-1])  # our mask: exactly these rows, all valid
        diff = (got - embeds[0, :valid]).abs().max().item()
        assert diff <= EMBED_ATOL, f"{text!r}: rows differ by {diff}"


def test_text_to_image_matches_diffusers_with_and_without_cfg(client: RawClient, pipe: Any) -> None:
    reqs = {
        "cfg": (
            "a red cube on a blue table",
            ImageParams(height=64, width=96, num_inference_steps=4, seed=7, negative_prompt=" "),
        ),
        "plain": ("a small cat", ImageParams(height=48, width=48, num_inference_steps=3, seed=8)),
    }
    for rid, (prompt, p) in reqs.items():
        submit(client, rid, prompt, p)
    for rid, (prompt, p) in reqs.items():
        assert_image(image_of(client, rid), diffusers_image(pipe, prompt, p))


def test_a_bad_size_fails_that_request_only(client: RawClient, pipe: Any) -> None:
    good = ImageParams(height=32, width=32, num_inference_steps=2, seed=1, negative_prompt="dark")
    submit(client, "too-big", "a cube", {"height": 1024, "width": 64})
    submit(client, "odd", "a cube", {"height": 40, "width": 64})
    submit(client, "fine", "a cube", good)
    for rid, why in (("too-big", "larger than this stage's maximum"), ("odd", "not a multiple of 16")):
        err = client.wait_terminal(rid, 300)
        assert isinstance(err, ErrorEvent) and err.code == "invalid_input" and why in err.message, err
    assert_image(image_of(client, "fine"), diffusers_image(pipe, "a cube", good))

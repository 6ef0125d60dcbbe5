"""The Qwen-Image DiT stage's engine (vLLM's EngineCore with omni_mp's diffusion scheduler and
worker, in this process) against diffusers' `QwenImagePipeline` on the same tiny checkpoint
(fp32, same seeds): the engine is fed the pipeline's own prompt embeddings, so what is
compared is our grid, noise, packing, batching, masks, CFG and decode. The engine runs each
denoising step in parts (one DiT block per engine step: `blocks_per_part: 1`), so requests
join between parts, restarting the step in flight or waiting for the next one.

Measured tolerances (CPU, fp32), stated where asserted:
- per-step latents, a request alone: max abs difference 1.4e-6 measured; asserted 1e-5;
- per-step latents, requests batched with others (padded text, masked attention, CFG rows
  in one call, joining mid-way): 2.7e-6 measured; asserted 1e-5;
- final image: within 1/255 per pixel (ours is uint8; diffusers' float image rounds to it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import torch

from omni_mp.engines.base import EngineInputError, StageInput
from omni_mp.engines.diffusion.engine import DiffusionEngine
from omni_mp.engines.diffusion.params import DiffusionStageConfig
from omni_mp.models.qwen_image.params import ImageParams
from omni_mp.models.registry import resolve_model
from omni_mp.wire.messages import SamplingParamsMsg
from tests.diffusers_oracle import diffusers_image

pytestmark = pytest.mark.engine

STEP_ATOL_ALONE = 1e-5
STEP_ATOL_BATCHED = 1e-5
PIXEL_ATOL = 1 / 255 + 1e-6


@pytest.fixture(scope="module")
def ckpt() -> str:
    return str(resolve_model("tiny-qwen-image"))


@pytest.fixture(scope="module")
def pipe(ckpt: str) -> Any:
    from diffusers import QwenImagePipeline

    return QwenImagePipeline.from_pretrained(ckpt, dtype=torch.float32)


@pytest.fixture(scope="module")
def engine(ckpt: str) -> Iterator[DiffusionEngine]:
    cfg = DiffusionStageConfig(
        model_type="qwen_image",
        model_options={"dtype": "float32", "max_height": 256, "max_width": 256, "blocks_per_part": 1},
        stream=False,
        max_batch=8,
    )
    eng = DiffusionEngine(ckpt, cfg, {"max_model_len": 2048})
    yield eng
    eng.shutdown()


class Oracle:
    """One diffusers run: its per-step latents and its final image (float [H, W, 3] in [0, 1])."""

    def __init__(self, pipe: Any, prompt: str, p: ImageParams, stop_after: int | None = None) -> None:
        """`stop_after` k: the pipeline is interrupted after k steps, so its image is its own
        decode of the latents at step k (what a preview after k steps shows)."""
        self.steps: list[torch.Tensor] = []

        def on_step(pipeline: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            self.steps.append(kwargs["latents"][0].clone())
            if stop_after is not None and i + 1 == stop_after:
                pipeline._interrupt = True  # the remaining steps are skipped, then it decodes
            return {}

        self.image = diffusers_image(pipe, prompt, p, on_step)
        self.prompt_embeds = pipe.encode_prompt(prompt)[0][0]
        self.negative_embeds = pipe.encode_prompt(p.negative_prompt)[0][0] if p.cfg else None


def stage_input(o: Oracle, p: ImageParams) -> StageInput:
    companions = [] if o.negative_embeds is None else [StageInput(prompt_embeds=o.negative_embeds)]
    return StageInput(prompt_embeds=o.prompt_embeds, companions=companions, params=msgspec.to_builtins(p))


def trajectories(eng: DiffusionEngine) -> dict[str, torch.Tensor]:
    return {rid: x for rid, (_, x) in progress(eng).items()}


def progress(eng: DiffusionEngine) -> dict[str, tuple[int, torch.Tensor]]:
    """Per running request: the solver steps it has taken and its latents after them."""

    def probe(worker: Any) -> dict[str, tuple[int, torch.Tensor]]:
        return {t.request_id: (t.k, t.x.clone()) for t in worker.model_runner.trajectories.values()}

    return eng.driver.core.collective_rpc(probe)[0]


def set_restart_before(eng: DiffusionEngine, fraction: float) -> None:
    def probe(worker: Any) -> None:
        worker.model_runner.restart_step_before = fraction

    eng.driver.core.collective_rpc(probe)


def add(eng: DiffusionEngine, rid: str, o: Oracle, p: ImageParams) -> None:
    eng.check_params(msgspec.to_builtins(p))
    eng.add(eng.prepare(rid, SamplingParamsMsg(), stage_input(o, p)))


def run(eng: DiffusionEngine, joins: dict[int, list[tuple[str, Oracle, ImageParams]]]) -> dict[str, Any]:
    """Step the engine, adding requests before the step whose index `joins` names; returns
    per request its latents after each of its steps and its image, and per engine step the
    solver steps begun and ended and each running request's steps taken."""
    latents: dict[str, list[torch.Tensor]] = {}
    images: dict[str, torch.Tensor] = {}
    trace: list[tuple[tuple[int, int], dict[str, int]]] = []
    step = 0
    while step in joins or eng.can_step():
        for rid, o, p in joins.pop(step, []):
            add(eng, rid, o, p)
        outs, _ = eng.step()
        now = progress(eng)
        trace.append((eng.step_progress(), {rid: k for rid, (k, _) in now.items()}))
        for rid, (k, x) in now.items():
            if k > len(latents.setdefault(rid, [])):  # a step of its ended in this engine step
                assert k == len(latents[rid]) + 1
                latents[rid].append(x)
        for out in outs:
            assert out.info is not None
            if "image_step" in out.info:  # a preview
                assert not out.finished
                images[f"{out.request_id}@{out.info['image_step']}"] = out.info["image"]
                continue
            assert out.finished and out.finish_reason == "stop", out
            images[out.request_id] = out.info["image"]
        step += 1
    assert not eng.take_failed()
    return {"latents": latents, "images": images, "trace": trace}


def check(o: Oracle, got_latents: list[torch.Tensor], image: torch.Tensor, atol: float) -> None:
    # The last step's latents leave with the request (decoded at once): compare the others.
    assert len(got_latents) == len(o.steps) - 1
    for k, (ours, ref) in enumerate(zip(got_latents, o.steps, strict=False)):
        diff = (ours - ref).abs().max().item()
        assert diff <= atol, f"step {k}: latents differ by {diff}"
    assert_pixels(image, o.image)


def assert_pixels(image: torch.Tensor, ref: torch.Tensor) -> None:
    assert image.dtype == torch.uint8 and tuple(image.shape) == tuple(ref.shape)
    diff = (image.float() / 255 - ref).abs().max().item()
    assert diff <= PIXEL_ATOL, f"image differs by {diff * 255:.2f}/255"


@pytest.mark.parametrize("cfg", [True, False], ids=["cfg", "no_cfg"])
def test_one_request_matches_diffusers(engine: DiffusionEngine, pipe: Any, cfg: bool) -> None:
    p = ImageParams(height=64, width=96, num_inference_steps=5, seed=11, negative_prompt=" " if cfg else None)
    o = Oracle(pipe, "a red cube on a blue table", p)
    got = run(engine, {0: [("one", o, p)]})
    check(o, got["latents"]["one"], got["images"]["one"], STEP_ATOL_ALONE)


def test_four_requests_joining_midway_each_match_their_oracle(engine: DiffusionEngine, pipe: Any) -> None:
    """Different sizes (two share one), steps, seeds, CFG scales, negative prompts and prompt
    lengths; two join while the others are part-way through their steps."""
    reqs = [
        ("a", "a cat", ImageParams(height=64, width=64, num_inference_steps=6, seed=1, negative_prompt=" ")),
        (
            "b",
            "the quick brown fox jumps over the lazy dog, in the style of a robot",
            ImageParams(height=64, width=64, num_inference_steps=4, seed=2, true_cfg_scale=2.5, negative_prompt="blur"),
        ),
        ("c", "a red cube", ImageParams(height=48, width=80, num_inference_steps=5, seed=3)),
        ("d", "hello world", ImageParams(height=96, width=32, num_inference_steps=3, seed=4, negative_prompt=" ")),
    ]
    oracles = {rid: Oracle(pipe, prompt, p) for rid, prompt, p in reqs}
    joins = {0: [(r, oracles[r], p) for r, _, p in reqs[:2]], 2: [(r, oracles[r], p) for r, _, p in reqs[2:]]}
    got = run(engine, joins)
    for rid, _, _ in reqs:
        check(oracles[rid], got["latents"][rid], got["images"][rid], STEP_ATOL_BATCHED)


def two_of_one_size(pipe: Any) -> list[tuple[str, Oracle, ImageParams]]:
    """Two requests of one size (one batch group): "a" with true CFG, "b" without."""
    pa = ImageParams(height=32, width=48, num_inference_steps=4, seed=21, negative_prompt=" ")
    pb = ImageParams(height=32, width=48, num_inference_steps=3, seed=22)
    return [("a", Oracle(pipe, "a red kite", pa), pa), ("b", Oracle(pipe, "two green apples on a plate", pb), pb)]


def test_a_request_arriving_early_in_a_step_restarts_it_with_the_batch(engine: DiffusionEngine, pipe: Any) -> None:
    """ "b" arrives when half of "a"'s first step has run (one of its two parts; the stage's
    `restart_step_before` is 0.5): that step starts again with both, so "b"'s first step
    begins in the engine step after its arrival. Both still equal their oracles."""
    (a, oa, pa), (b, ob, pb) = reqs = two_of_one_size(pipe)
    got = run(engine, {0: [reqs[0]], 1: [reqs[1]]})
    trace = got["trace"]
    assert trace[0] == ((1, 0), {"a": 0})  # a's first step: its first part
    assert trace[1] == ((1, 0), {"a": 0, "b": 0})  # begun again with b: the part run is dropped
    assert trace[2] == ((0, 1), {"a": 1, "b": 1})  # one step for both
    for rid, o in ((a, oa), (b, ob)):
        check(o, got["latents"][rid], got["images"][rid], STEP_ATOL_BATCHED)


def test_a_request_arriving_late_in_a_step_joins_the_next_one(engine: DiffusionEngine, pipe: Any) -> None:
    """With `restart_step_before` below the part already run, the step in flight ends first
    (without "b") and "b" joins the next one."""
    (a, oa, pa), (b, ob, pb) = reqs = two_of_one_size(pipe)
    set_restart_before(engine, 0.25)
    try:
        got = run(engine, {0: [reqs[0]], 1: [reqs[1]]})
    finally:
        set_restart_before(engine, 0.5)
    trace = got["trace"]
    assert trace[0] == ((1, 0), {"a": 0})
    assert trace[1] == ((0, 1), {"a": 1, "b": 0})  # a's step ends without b
    assert trace[2] == ((1, 0), {"a": 1, "b": 0})  # the next one has both
    assert trace[3] == ((0, 1), {"a": 2, "b": 1})
    for rid, o in ((a, oa), (b, ob)):
        check(o, got["latents"][rid], got["images"][rid], STEP_ATOL_BATCHED)


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ({"height": 72, "width": 64}, "not a multiple of 16"),
        ({"height": 512, "width": 64}, "larger than this stage's maximum"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_params_fail_before_any_work(engine: DiffusionEngine, params: dict[str, Any], why: str) -> None:
    with pytest.raises(EngineInputError, match=why):
        engine.check_params(params)
    assert not engine.can_step()


def test_wrong_rows_fail_that_request_only(engine: DiffusionEngine) -> None:
    p = msgspec.to_builtins(ImageParams(height=32, width=32, num_inference_steps=2, seed=0, negative_prompt=" "))
    width = engine.model.text_width
    with pytest.raises(EngineInputError, match="negative prompt's rows"):
        engine.prepare("x", SamplingParamsMsg(), StageInput(prompt_embeds=torch.zeros(3, width), params=p))
    with pytest.raises(EngineInputError, match="text rows"):
        engine.prepare("y", SamplingParamsMsg(), StageInput(prompt_embeds=torch.zeros(3, width + 1), params=p))


def test_abort_frees_the_slot_at_the_next_step(engine: DiffusionEngine, pipe: Any) -> None:
    p = ImageParams(height=32, width=32, num_inference_steps=8, seed=5)
    o = Oracle(pipe, "a cube", p)
    add(engine, "gone", o, p)
    add(engine, "kept", o, msgspec.structs.replace(p, num_inference_steps=3))
    engine.step()
    assert set(trajectories(engine)) == {"gone", "kept"}
    engine.abort(["gone"])
    outs, _ = engine.step()
    assert set(trajectories(engine)) <= {"kept"} and all(out.request_id == "kept" for out in outs)
    while engine.can_step():
        engine.step()
    assert trajectories(engine) == {} and not engine.batcher.requests


def test_previews_every_k_steps_show_the_current_latents(engine: DiffusionEngine, pipe: Any) -> None:
    p = ImageParams(height=32, width=48, num_inference_steps=5, seed=9, negative_prompt=" ", preview_every=2)
    o = Oracle(pipe, "a green ball", p)
    got = run(engine, {0: [("pv", o, p)]})
    assert sorted(got["images"]) == ["pv", "pv@2", "pv@4"]  # not after the last step: that is the image
    check(o, got["latents"]["pv"], got["images"]["pv"], STEP_ATOL_ALONE)
    for k in (2, 4):
        assert_pixels(got["images"][f"pv@{k}"], Oracle(pipe, "a green ball", p, stop_after=k).image)

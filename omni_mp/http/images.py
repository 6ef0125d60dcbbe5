"""`/v1/images/generations`: the OpenAI body -> one pipeline request per image (`ImageJob`),
and the pipeline's answers -> PNGs (`run_images`, `stream_image`).

A request's image parameters travel in `Submit.params` under the names the image families
take (`height`, `width`, `num_inference_steps`, `true_cfg_scale`, `negative_prompt`, `seed`,
`preview_every`); the stage checks them (e.g. Qwen-Image's multiple of 16) and a refusal comes
back as a 400. Every image gets a seed: the request's, else one drawn here, so that the
answer can say which (image i of n gets seed + i)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_mp.client.omni_client import AsyncOmniClient, ImageChunk, RequestError
from omni_mp.http.audio_out import b64
from omni_mp.http.errors import bad_request, from_request_error
from omni_mp.http.pipeline import PipelineView
from omni_mp.http.schemas import ImageGenerationRequest, ImageStreamEvent, to_json
from omni_mp.media.image_io import draw_seed, parse_size, png_bytes

# OpenAI fields taken only at their default (or "auto"): anything else is refused, not ignored.
_DEFAULT_ONLY = {
    "quality": ("auto", "standard"),
    "style": (),
    "background": ("auto", "opaque"),
    "moderation": ("auto",),
}


@dataclass(frozen=True)
class ImageJob:
    prompt: str
    n: int
    seed: int  # of the first image
    params: dict[str, Any]  # Submit.params, without the seed
    stream: bool = False
    partial_images: int = 0


def _size(size: str | None) -> tuple[int, int] | None:
    """(width, height); None for "auto" or no size (the stage's default)."""
    if size is None or size == "auto":
        return None
    try:
        return parse_size(size)
    except ValueError as err:
        raise bad_request(f"{err} (or 'auto')", "size") from None


def parse_images(req: ImageGenerationRequest, view: PipelineView) -> ImageJob:
    """Validate what the schema cannot; map the fields onto the image stage's params."""
    if view.image_stage is None:
        raise bad_request(f"pipeline {view.cfg.name!r} makes no images", "model", "unsupported_value")
    if req.response_format not in (None, "b64_json"):
        what = "this server stores no images, so it returns them inline" if req.response_format == "url" else ""
        raise bad_request(
            f"response_format {req.response_format!r} is not supported{': ' + what if what else ''}; use 'b64_json'",
            "response_format",
            "unsupported_value",
        )
    if req.output_format not in (None, "png"):
        raise bad_request(f"output_format {req.output_format!r}: only 'png'", "output_format", "unsupported_value")
    for name, allowed in _DEFAULT_ONLY.items():
        value = getattr(req, name)
        if value is not None and value not in allowed:
            raise bad_request(f"{name} {value!r} is not supported", name, "unsupported_value")
    if req.output_compression is not None:
        raise bad_request("output_compression is for jpeg/webp; images here are png", "output_compression")
    n = req.n or 1
    stream = bool(req.stream)
    if stream and n != 1:
        raise bad_request("stream: true takes n=1", "n", "unsupported_value")
    if req.partial_images and not stream:
        raise bad_request("partial_images needs stream: true", "partial_images")
    params: dict[str, Any] = {}
    size = _size(req.size)
    if size is not None:
        params["width"], params["height"] = size
    for name in ("num_inference_steps", "true_cfg_scale", "negative_prompt"):
        if getattr(req, name) is not None:
            params[name] = getattr(req, name)
    partial = req.partial_images or 0
    if partial:
        if req.num_inference_steps is None:  # (previews are asked for every k steps)
            raise bad_request("partial_images needs num_inference_steps", "num_inference_steps")
        # At most `partial` previews, evenly spread before the last step (which has none).
        params["preview_every"] = -(-req.num_inference_steps // (partial + 1))
    seed = req.seed if req.seed is not None else draw_seed()
    return ImageJob(req.prompt, n, seed, params, stream, partial)


def image_size(pixels: np.ndarray) -> str:
    return f"{pixels.shape[1]}x{pixels.shape[0]}"


async def png_b64(pixels: np.ndarray) -> str:
    """The image as base64 PNG, encoded off the event loop (a 1024x1024 PNG takes tens of ms)."""
    return b64(await asyncio.to_thread(png_bytes, pixels))


async def run_images(client: AsyncOmniClient, job: ImageJob, request_id: str) -> list[tuple[np.ndarray, int]]:
    """The n images (pixels, seed), made concurrently; the first failure cancels the others
    (cancelling a request aborts it in every stage)."""

    async def one(i: int) -> tuple[np.ndarray, int]:
        seed = job.seed + i
        params = {**job.params, "seed": seed}
        image = await client.generate_image(job.prompt, params=params, request_id=f"{request_id}-{i}")
        return image, seed

    tasks = [asyncio.ensure_future(one(i)) for i in range(job.n)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_image(client: AsyncOmniClient, job: ImageJob, request_id: str) -> AsyncIterator[ImageChunk]:
    """At most `partial_images` previews as the stage decodes them, then the image."""
    previews = 0
    events = client.stream_images(job.prompt, params={**job.params, "seed": job.seed}, request_id=request_id)
    try:
        async for chunk in events:
            if chunk.step is None or previews < job.partial_images:
                previews += chunk.step is not None
                yield chunk
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def image_events(chunks: AsyncIterator[ImageChunk], seed: int, created: int) -> AsyncIterator[bytes]:
    """SSE as OpenAI streams images: `image_generation.partial_image` per preview, then
    `image_generation.completed`; an error after the first event is an `error` event."""
    index = 0
    try:
        async for chunk in chunks:
            preview = chunk.step is not None
            ev = ImageStreamEvent(
                type="image_generation.partial_image" if preview else "image_generation.completed",
                b64_json=await png_b64(chunk.pixels),
                created_at=created,
                size=image_size(chunk.pixels),
                seed=seed,
                partial_image_index=index if preview else None,
                step=chunk.step,
            )
            index += preview
            yield b"event: " + ev.type.encode() + b"\ndata: " + to_json(ev) + b"\n\n"
    except RequestError as err:
        yield b"event: error\ndata: " + to_json(from_request_error(err).body) + b"\n\n"
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]

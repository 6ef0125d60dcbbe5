"""The Qwen-Image family on the GPU (was launch/gpu_qwen_image_check.py): serve
omni_mp/stage_configs/tiny_qwen_image_gpu.yaml (both stages on GPU 0, fp32), send requests of
different sizes, steps, seeds and CFG settings at once (they batch in the DiT stage), and compare
each image with diffusers' `QwenImagePipeline` on the CPU (fp32, same seed): at most 1/255 apart
in every pixel."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu

MAX_DIFF_255 = 1.0  # the largest pixel difference allowed, in 1/255 steps


def requests() -> dict[str, tuple[str, Any]]:
    from omni_mp.models.qwen_image.params import ImageParams as P

    return {
        "cfg-64x96": ("a red cube", P(height=64, width=96, num_inference_steps=8, seed=1, negative_prompt=" ")),
        "cfg-b": (
            "a cat", P(height=64, width=96, num_inference_steps=5, seed=2, true_cfg_scale=2.5, negative_prompt="x")
        ),
        "plain-128": ("hello world", P(height=128, width=128, num_inference_steps=6, seed=3)),
        "cfg-256x128": ("a green ball", P(height=256, width=128, num_inference_steps=4, seed=4, negative_prompt=" ")),
    }  # fmt: skip


def serve(cfg: Any, reqs: dict[str, tuple[str, Any]]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Every request sent at once over the client socket; each image and the seconds to it."""
    import msgspec
    import zmq

    from omni_mp.control.embedded import embedded_pipeline
    from omni_mp.wire.codec import decode, encode
    from omni_mp.wire.messages import IMAGE_KEY, ErrorEvent, Finished, StageOutputChunk, Submit

    images: dict[str, torch.Tensor] = {}
    seconds: dict[str, float] = {}
    with embedded_pipeline(cfg, progress=lambda m: print(f"[omni_mp] {m}", flush=True)) as coord:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(coord.client_endpoint)
        t0 = time.monotonic()
        for rid, (prompt, p) in reqs.items():
            submit = Submit(request_id=rid, prompt=prompt, params=msgspec.to_builtins(p), stream=True, deadline_s=600)
            sock.send_multipart(encode(submit))
        done: set[str] = set()
        while len(done) < len(reqs):
            if not sock.poll(600_000):
                raise TimeoutError("no answer within 600 s")
            msg = decode(sock.recv_multipart())
            if isinstance(msg, ErrorEvent):
                raise RuntimeError(f"{msg.request_id}: {msg.code}: {msg.message}")
            if isinstance(msg, StageOutputChunk) and msg.additional_information and msg.finished:
                images[msg.request_id] = msg.additional_information[IMAGE_KEY].cpu()
                seconds[msg.request_id] = time.monotonic() - t0
            if isinstance(msg, Finished):
                done.add(msg.request_id)
        sock.close(linger=0)
        ctx.term()
    return images, seconds


def test_images_equal_diffusers(report: Callable[[dict[str, Any]], Path]) -> None:
    from diffusers import QwenImagePipeline

    from omni_mp.config.validate import load_config
    from omni_mp.models.registry import resolve_model
    from omni_mp.stage_configs import shipped_config
    from tests.diffusers_oracle import diffusers_image

    cfg = load_config(shipped_config("tiny_qwen_image_gpu"))
    reqs = requests()
    images, seconds = serve(cfg, reqs)
    model_dir = str(resolve_model(cfg.stages[-1].model))
    rows = {}
    for rid, (prompt, p) in reqs.items():
        ref = diffusers_image(QwenImagePipeline.from_pretrained(model_dir, dtype=torch.float32), prompt, p)
        diff = (images[rid].float() / 255 - ref).abs().max().item() * 255
        rows[rid] = {"shape": tuple(images[rid].shape), "seconds": seconds[rid], "max_diff_255": diff}
        print(f"{rid}: {tuple(images[rid].shape)} in {seconds[rid]:.2f}s, max |ours - diffusers| = {diff:.2f}/255")
    report({"requests": rows})
    worst = max(r["max_diff_255"] for r in rows.values())
    assert worst <= MAX_DIFF_255, rows

"""Qwen-Image family check on a GPU host: serve a Qwen-Image pipeline, send a few requests of
different sizes, steps, seeds and CFG settings at once (they batch in the DiT stage), and
compare each image with diffusers' `QwenImagePipeline` on the CPU (fp32, same seed).

    python launch/gpu_qwen_image_check.py --config omni_mp/stage_configs/tiny_qwen_image_gpu.yaml

Prints per request the max pixel difference (in 1/255 steps) and the time to its image.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402

from omni_mp.config.validate import load_config  # noqa: E402
from omni_mp.control.embedded import embedded_pipeline  # noqa: E402
from omni_mp.models.qwen_image.params import ImageParams  # noqa: E402
from omni_mp.models.registry import resolve_model  # noqa: E402
from omni_mp.wire.codec import decode, encode  # noqa: E402
from omni_mp.wire.messages import IMAGE_KEY, ErrorEvent, Finished, StageOutputChunk, Submit  # noqa: E402
from tests.diffusers_oracle import diffusers_image  # noqa: E402

P = ImageParams
REQUESTS = {
    "cfg-64x96": ("a red cube", P(height=64, width=96, num_inference_steps=8, seed=1, negative_prompt=" ")),
    "cfg-b": ("a cat", P(height=64, width=96, num_inference_steps=5, seed=2, true_cfg_scale=2.5, negative_prompt="x")),
    "plain-128": ("hello world", P(height=128, width=128, num_inference_steps=6, seed=3)),
    "cfg-256x128": ("a green ball", P(height=256, width=128, num_inference_steps=4, seed=4, negative_prompt=" ")),
}  # fmt: skip


def reference(model_dir: str, prompt: str, p: ImageParams) -> torch.Tensor:
    from diffusers import QwenImagePipeline

    return diffusers_image(QwenImagePipeline.from_pretrained(model_dir, dtype=torch.float32), prompt, p)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--log-dir", type=Path)
    args = ap.parse_args()
    cfg = load_config(args.config)
    images: dict[str, torch.Tensor] = {}
    seconds: dict[str, float] = {}
    with embedded_pipeline(cfg, log_dir=args.log_dir, progress=lambda m: print(f"[omni_mp] {m}", flush=True)) as coord:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(coord.client_endpoint)
        t0 = time.monotonic()
        for rid, (prompt, p) in REQUESTS.items():
            submit = Submit(request_id=rid, prompt=prompt, params=msgspec.to_builtins(p), stream=True, deadline_s=600)
            sock.send_multipart(encode(submit))
        done: set[str] = set()
        while len(done) < len(REQUESTS):
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
    model_dir = str(resolve_model(cfg.stages[-1].model))
    worst = 0.0
    for rid, (prompt, p) in REQUESTS.items():
        ref = reference(model_dir, prompt, p)
        diff = (images[rid].float() / 255 - ref).abs().max().item() * 255
        worst = max(worst, diff)
        print(f"{rid}: {tuple(images[rid].shape)} in {seconds[rid]:.2f}s, max |ours - diffusers| = {diff:.2f}/255")
    print(f"worst: {worst:.2f}/255 ({'OK' if worst <= 1.0 else 'MORE THAN 1/255'})")
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

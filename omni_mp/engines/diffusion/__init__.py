"""The diffusion stage kind: a request is a denoising trajectory (or, streamed, a series of
them over windows of its input), advanced one solver step at a time by vLLM's `EngineCore`
with omni_mp's diffusion scheduler and worker (`omni_mp.engines.diffusion.vllm_hooks`).

- `model`: what a diffusion model provides (condition, one batched velocity evaluation, decode).
  Models live with their family (Qwen2.5-Omni's token2wav: omni_mp.models.qwen2_5_omni.token2wav),
  found by `diffusion.model_type` through omni_mp.models.registry.
- `solver`: time grids and ODE solver steps (RK4 as in transformers, Euler), batched.
- `chunking`: streaming windows over the input and the joining of output chunks.
- `batcher` (scheduler side) and `runner` (worker side): continuous batching between steps.
- `engine`: what the stage loop drives.
"""

"""Qwen2.5-Omni token2wav's opt-in precisions and torch.compile choices, as a token2wav stage's
`diffusion.model_options` and `float32_matmul` name them (benchmarks.omni_gpu's flags, the
token2wav profile and the GPU tests of its CUDA graphs)."""

from __future__ import annotations

# --token2wav-dtype -> the token2wav stage's model_options (bf16 is opt-in: it changes the waveform)
T2W_DTYPES: dict[str, dict[str, str]] = {
    "float32": {},
    "bfloat16-dit": {"dit_dtype": "bfloat16"},
    "bfloat16": {"dit_dtype": "bfloat16", "vocoder_dtype": "bfloat16"},
}
# --token2wav-compile -> more model_options: torch.compile of the DiT block / BigVGAN's
# activations ("all" is what a CUDA stage does by default)
T2W_COMPILE: dict[str, dict[str, bool]] = {
    "off": {"compile_dit": False, "compile_vocoder": False},
    "dit": {"compile_dit": True, "compile_vocoder": False},
    "all": {"compile_dit": True, "compile_vocoder": True},
}


def use_precision(precision: str) -> None:
    """What a diffusion stage with `float32_matmul: <precision>` runs with (use_kernel_settings):
    matmuls AND cuDNN convolutions, so "highest" is exact fp32 throughout (PyTorch lets cuDNN
    convolutions use TF32 by default, whatever the matmul precision)."""
    from omni_mp.engines.diffusion.params import DiffusionStageConfig
    from omni_mp.engines.diffusion.vllm_hooks import use_kernel_settings

    use_kernel_settings(DiffusionStageConfig(float32_matmul=precision))  # type: ignore[arg-type]

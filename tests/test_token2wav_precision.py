"""token2wav's opt-in reduced precision (`diffusion.model_options: dit_dtype / vocoder_dtype:
bfloat16`) against transformers' own modules run the same way: their weights cast to bf16 and
called under bf16 autocast (CPU, tiny token2wav, random weights).

Tolerances (relative L2 of the guided velocity / of the waveform before clamping), measured:
- fp32 (the default) against transformers in fp32: 2.8e-7 (bound 1e-5, as before).
- bf16 DiT against transformers' bf16 DiT: 6.7e-3 (bound 2e-2). Not bit-equal: the speaker
  encoder's rows are ours in fp32 (computed once at load), transformers' in bf16 per call.
  For scale, transformers' bf16 DiT against its fp32 one: 9.1e-3, so the option is on (the
  test requires > 1e-3 from fp32) and bf16 error is all that separates it from transformers.
- bf16 vocoder against transformers' BigVGAN in bf16: bound 2e-2.
"""

from __future__ import annotations

import copy

import pytest
import torch

from omni_mp.engines.diffusion.model import Window
from omni_mp.engines.diffusion.params import DiffusionParams, DiffusionStageConfig
from omni_mp.engines.diffusion.vllm_hooks import use_kernel_settings
from omni_mp.models.qwen2_5_omni.speakers import load_speakers
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel

CPU = torch.device("cpu")
GUIDANCE = 0.5


@pytest.fixture(scope="module")
def t2w_dir() -> str:
    return str(build_token2wav(TOKEN2WAV_SPECS["tiny-token2wav"]))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def transformers_velocity(dit: torch.nn.Module, t2w_dir: str, codes: torch.Tensor, x: torch.Tensor,
                          t: torch.Tensor, bf16: bool) -> torch.Tensor:  # fmt: skip
    """transformers' DiT forward (conditional and unconditional rows) and the CFG combination
    of its `sample`, for one request."""
    spk = load_speakers(t2w_dir)["Chelsie"]
    ref_mel = spk["ref_mel"].float().reshape(1, -1, x.shape[-1])
    cond = spk["cond"].float().reshape(1, 1, -1).repeat(1, x.shape[1], 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = dit(hidden_states=x, condition_vector=ref_mel, speaker_embedding=cond, quantized_code=codes[None],
                  time_step=t, apply_cfg=True).float()  # fmt: skip
    return out[0] + (out[0] - out[1]) * GUIDANCE


def one_request(model: Token2WavModel, n: int = 60) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Window]:
    """A 60-code request's codes, a state x at time t, and its window (CFG on)."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, model.num_codes - 1, (n,), generator=g)
    x = torch.randn(1, n * model.frames_per_input, model.state_dim, generator=g)
    window = Window("a", codes, 0, DiffusionParams(seed=1, speaker="Chelsie", guidance_scale=GUIDANCE))
    return codes, x, torch.tensor([0.37]), window


def test_bf16_dit_is_transformers_dit_under_bf16_autocast(t2w_dir: str) -> None:
    f32 = Token2WavModel.from_checkpoint(t2w_dir, CPU)
    b16 = Token2WavModel.from_checkpoint(t2w_dir, CPU, dit_dtype="bfloat16")
    assert next(b16.dit.parameters()).dtype == torch.bfloat16
    assert next(b16.vocoder.parameters()).dtype == torch.float32  # only what was asked for
    hf32 = copy.deepcopy(f32.dit)
    hf16 = copy.deepcopy(f32.dit).to(torch.bfloat16)
    codes, x, t, window = one_request(f32)

    def ours(m: Token2WavModel) -> torch.Tensor:
        v = m.velocity(m.collate([m.condition(window)], torch.tensor([GUIDANCE])), x, t)
        assert v.dtype == torch.float32  # the solver's state stays fp32
        return v[0]

    v32, v16 = ours(f32), ours(b16)
    assert rel(v32, transformers_velocity(hf32, t2w_dir, codes, x, t, bf16=False)) <= 1e-5
    assert rel(v16, transformers_velocity(hf16, t2w_dir, codes, x, t, bf16=True)) <= 2e-2
    assert rel(v16, v32) > 1e-3  # the option is in effect


def test_bf16_vocoder_is_transformers_bigvgan_in_bf16(t2w_dir: str) -> None:
    b16 = Token2WavModel.from_checkpoint(t2w_dir, CPU, vocoder_dtype="bfloat16")
    f32 = Token2WavModel.from_checkpoint(t2w_dir, CPU)
    assert next(b16.vocoder.parameters()).dtype == torch.bfloat16
    assert next(b16.dit.parameters()).dtype == torch.float32
    mel = torch.randn(2, b16.state_dim, 40, generator=torch.Generator().manual_seed(4)) - 4.0
    hf16 = copy.deepcopy(f32.vocoder).to(torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = hf16(mel).float()  # transformers' forward: [2, samples]
    got = b16._vocode(mel)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert rel(got, want) <= 2e-2
    assert rel(got, f32._vocode(mel)) > 1e-4


def test_model_options_are_checked(t2w_dir: str) -> None:
    with pytest.raises(Exception, match="dit_dtype"):
        Token2WavModel.from_checkpoint(t2w_dir, CPU, dit_dtype="float16")
    with pytest.raises(Exception, match="no_such_option"):
        Token2WavModel.from_checkpoint(t2w_dir, CPU, no_such_option=1)


def test_stage_kernel_settings_undo_what_importing_vllm_turns_off() -> None:
    """vLLM's CUDA platform module turns cuDNN attention off when imported; a diffusion stage's
    worker sets the stage's own choice (default on, as diffusers and transformers run)."""
    before = (torch.backends.cuda.cudnn_sdp_enabled(), torch.get_float32_matmul_precision())
    try:
        torch.backends.cuda.enable_cudnn_sdp(False)  # what `import vllm.platforms.cuda` does
        use_kernel_settings(DiffusionStageConfig())
        assert torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        use_kernel_settings(DiffusionStageConfig(cudnn_attention=False, float32_matmul="high"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before[0])
        torch.set_float32_matmul_precision(before[1])
        torch.backends.cudnn.allow_tf32 = True

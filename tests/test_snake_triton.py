"""SnakeBeta as one Triton kernel (omni_mp/models/qwen3_omni/snake_triton.py, what the code2wav and
Qwen3-TTS decoder stages run on CUDA) against transformers' `Qwen3OmniMoeSnakeBeta`, on the CPU
through Triton's interpreter (`TRITON_INTERPRET=1`, read when the kernel is defined, so the checks
run in a process of their own):
- the kernel alone, on random per-channel parameters: one sample to past one tile, several rows,
  views whose rows are not contiguous (the transposed convolutions' trimmed outputs) and one
  whose samples are not (copied first); equal to transformers within a few float32 roundings;
- the streamed convolutional half with every SnakeBeta as the kernel (`fused_snake`), chunk by
  chunk with its kept inputs, against transformers' upsampler and decoder run once over all the
  frames: the tiny Qwen3-Omni code2wav and the tiny Qwen3-TTS decoder (right-trimmed transposed
  convolutions), float32, rows of random transformer outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

KERNEL_RTOL = 1e-6  # relative to the output's largest magnitude; float32 sin and sums differ in the last bits
# The whole half streamed in float32 against the one-shot pass, relative to the peak: 3.1e-5 with
# transformers' SnakeBeta, 3.0e-5 with the kernel (measured here: summation order, not the kernel)
CONVS_RTOL = 1e-4


def test_snake_kernel_and_fused_convolutions_are_transformers() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    repo = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "tests.test_snake_triton"]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for what in ("kernel", "tiny-qwen3-omni-code2wav", "tiny-qwen3-tts-custom-voice"):
        assert f"checked {what}" in proc.stdout, proc.stdout


def test_the_kernel_compiles_for_an_h200_with_cudas_accurate_sin() -> None:
    """Triton's compiler for sm_90 (no GPU needed: its bundled ptxas), both dtypes a decoder runs:
    one kernel each, whose `sin` is libdevice's `__nv_sinf` (what torch's CUDA `sin` computes),
    not the approximate instruction."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from omni_mp.models.qwen3_omni.snake_triton import BLOCK, _snake_beta

    for dtype in ("*fp32", "*bf16"):
        args = {"x_ptr": dtype, "out_ptr": dtype, "alpha_ptr": "*fp32", "inv_beta_ptr": "*fp32"}
        args |= {name: "i32" for name in ("T", "C", "stride_b", "stride_c")}
        src = ASTSource(fn=_snake_beta, signature={**args, "BLOCK": "constexpr"}, constexprs={"BLOCK": BLOCK})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        assert kernel.asm["cubin"] and "__nv_sinf" in kernel.asm["ptx"], dtype
        assert "sin.approx" not in kernel.asm["ptx"], dtype


def test_fused_snake_needs_a_cuda_device() -> None:
    """Asked for on a CPU (no Triton device), the option fails at load, naming it."""
    import torch

    from omni_mp.models.qwen3_omni.code2wav import Code2WavOptions

    assert not Code2WavOptions().fused_snake_on(torch.device("cpu"))
    with pytest.raises(ValueError, match="fused_snake"):
        Code2WavOptions(fused_snake=True).fused_snake_on(torch.device("cpu"))


def _rel(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _check_kernel() -> None:
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeSnakeBeta

    from omni_mp.models.qwen3_omni.snake_triton import BLOCK, TritonSnakeBeta

    g = torch.Generator().manual_seed(5)
    for channels in (1, 3, 37):
        act = Qwen3OmniMoeSnakeBeta(channels)
        with torch.no_grad():  # log-scale parameters around 0, as trained ones are
            act.alpha.copy_(torch.randn(channels, generator=g) * 0.5)
            act.beta.copy_(torch.randn(channels, generator=g) * 0.5)
        kernel = TritonSnakeBeta(act)
        inputs = [torch.randn(rows, channels, n, generator=g) * 3 for rows, n in ((1, 1), (2, 5), (3, BLOCK + 7))]
        wide = torch.randn(2, channels, 40, generator=g) * 3
        inputs += [wide[:, :, 3:30], wide.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :17]]
        inputs += [torch.randn(2, 9, channels, generator=g).transpose(1, 2)]  # samples not contiguous
        with torch.no_grad():
            for x in inputs:
                want, got = act(x), kernel(x)
                assert got.shape == want.shape and got.is_contiguous(), (got.shape, want.shape)
                err = _rel(got, want)
                assert err <= KERNEL_RTOL, (channels, tuple(x.shape), x.stride(), err)
    try:
        kernel(torch.zeros(1, 38, 4))
    except ValueError as e:
        assert "37 channels" in str(e), e
    else:
        raise AssertionError("a mis-shaped input was taken")
    print("checked kernel")


def _check_convs(name: str) -> None:
    import torch

    from omni_mp.models.qwen3_omni.code2wav import Code2WavModel
    from omni_mp.models.qwen3_omni.code2wav_convs import StreamingConvs
    from omni_mp.models.qwen3_tts.codec_decoder import TtsCodecDecoder
    from omni_mp.models.registry import builtin_model
    from tests.test_qwen3_omni_code2wav import convs_one_shot

    cls = TtsCodecDecoder if "tts" in name else Code2WavModel
    hf = cls.from_checkpoint(builtin_model(name), torch.device("cpu")).hf
    convs = StreamingConvs(hf, fused_snake=True)
    assert convs.fused_snake and all(type(s).__name__ == "TritonSnakeBeta" for st in convs.steps for s in st.snakes)
    assert sum(len(st.snakes) for st in convs.steps) > 10  # every block's and residual unit's
    hidden = torch.randn(2, hf.config.hidden_size, 6, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = convs_one_shot(hf, hidden)
        got, kept, start = [], None, 0
        for n in (1, 2, 3):
            wav, kept = convs.run(hidden[..., start : start + n], kept)
            got.append(wav)
            start += n
    got_all = torch.cat(got, dim=-1)
    assert got_all.shape == want.shape, (got_all.shape, want.shape)
    err = _rel(got_all, want)
    assert want.abs().max() > 1e-3 and err <= CONVS_RTOL, (name, err)
    print(f"checked {name}")


if __name__ == "__main__":
    _check_kernel()
    _check_convs("tiny-qwen3-omni-code2wav")
    _check_convs("tiny-qwen3-tts-custom-voice")

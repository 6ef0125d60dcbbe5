"""SnakeBeta (`Qwen3OmniMoeSnakeBeta`: x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2, per
channel) as one Triton kernel, for the convolutional half of Qwen3-Omni's code2wav and of
Qwen3-TTS's codec decoder on CUDA (code2wav_convs.StreamingConvs).

Why a kernel: transformers' form is nine kernels a call (two exps, the divisor's add and
reciprocal, then x * alpha, sin, pow, the product and the sum over the whole [rows, channels,
samples] tensor: five full passes that read six tensors and write five). In the Qwen3-TTS
decoder on an H200 (TF32, benchmarks.tts_codec's kernel table) those elementwise kernels were
40% of the decoder's kernel time. Here one pass reads x once and writes the output once.

Why not `torch.compile`: the decoder's shapes change with every chunk and row bucket, and
inductor's dynamic-shape kernels index with 64-bit divisions by the runtime length, which ran
at a fifth of the memory bandwidth in Qwen2.5-Omni's vocoder (vocoder_triton.py). One program
here takes one row (batch x channel) and a tile of samples: a few 32-bit operations a sample.

The same arithmetic in the same order as transformers' (the divisor from exp(beta) + 1e-9, its
reciprocal, sin(x * alpha) squared as a product, which `pow(., 2)` is); only `sin` may differ
in its last bit. Every runtime argument is left unspecialized (neither on value nor alignment),
so one compiled kernel per dtype serves every shape and view: a shape first seen while serving
compiles nothing (Triton's JIT would otherwise stall the stage for a compile per new variant).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 512  # samples per program
_RUNTIME_ARGS = ("x_ptr", "out_ptr", "alpha_ptr", "inv_beta_ptr", "T", "C", "stride_b", "stride_c")


@triton.jit(do_not_specialize=_RUNTIME_ARGS, do_not_specialize_on_alignment=_RUNTIME_ARGS)
def _snake_beta(x_ptr, out_ptr, alpha_ptr, inv_beta_ptr, T, C, stride_b, stride_c, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # b * C + c
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = t < T
    b = row // C
    c = row - b * C
    alpha = tl.load(alpha_ptr + c)
    inv_beta = tl.load(inv_beta_ptr + c)
    x = tl.load(x_ptr + b.to(tl.int64) * stride_b + c.to(tl.int64) * stride_c + t, mask=live, other=0.0)
    x = x.to(tl.float32)
    sine = tl.sin(x * alpha)
    y = x + inv_beta * (sine * sine)
    tl.store(out_ptr + row.to(tl.int64) * T + t, y.to(out_ptr.dtype.element_ty), mask=live)


class TritonSnakeBeta:
    """One `Qwen3OmniMoeSnakeBeta`'s parameters, prepared once (its exps and reciprocal are
    per channel, the same for every call), and the kernel over [B, C, T] inputs whose samples
    are contiguous (any batch and channel strides: the transposed convolutions' trimmed views
    go in without a copy)."""

    def __init__(self, module: Any) -> None:
        with torch.no_grad():
            self.alpha = torch.exp(module.alpha.detach().float()).contiguous()
            self.inv_beta = (1.0 / (torch.exp(module.beta.detach().float()) + module.no_div_by_zero)).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[1] != self.alpha.numel():
            raise ValueError(f"SnakeBeta of {self.alpha.numel()} channels: an input of shape {tuple(x.shape)}")
        if x.stride(2) != 1:
            x = x.contiguous()
        b, c, t = x.shape
        out = torch.empty(b, c, t, dtype=x.dtype, device=x.device)
        if out.numel():
            grid = (b * c, triton.cdiv(t, BLOCK))
            _snake_beta[grid](x, out, self.alpha, self.inv_beta, t, c, x.stride(0), x.stride(1), BLOCK=BLOCK)
        return out

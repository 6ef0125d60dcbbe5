"""BigVGAN's anti-aliased SnakeBeta (`Qwen2_5OmniAntiAliasedActivation1d`) as two Triton
kernels, the CUDA form of `token2wav_fused.AntialiasedSnake` (the same polyphase arithmetic).

Why not `torch.compile` of the polyphase functions: with dynamic shapes inductor indexes the
flat tensor with 64-bit divisions by the runtime length, and its kernels ran at a fifth of the
memory bandwidth. On an H200 (TF32, 32 windows of 148 mel frames) the activations took 150 of
the vocoder's 217 ms, 1.4 ms each for a tensor of 109 MB (benchmarks.token2wav_profile).
Here each program takes one row (batch x channel) and a tile of samples, so the index
arithmetic is a few 32-bit operations, and the kernels only read and write what they must:

- `_up_snake`: per output phase p, a K/r-tap filter over the input (replicate padding is a clamp
  of indices), then SnakeBeta; written planar, [rows, r, T], so that both kernels access
  memory contiguously.
- `_down`: the strided low-pass filter, reading the interleaved signal z[m] = S[m % r, m // r]
  at clamped positions (replicate padding).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 512  # samples per program


@triton.jit
def _up_snake(
    x_ptr, s_ptr, w_ptr, d_ptr, alpha_ptr, inv_beta_ptr, T, C,
    UP_PAD: tl.constexpr, RATIO: tl.constexpr, TAPS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    q = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = q < T
    c = row % C
    alpha = tl.load(alpha_ptr + c)
    inv_beta = tl.load(inv_beta_ptr + c)
    x_row = x_ptr + row.to(tl.int64) * T
    s_row = s_ptr + row.to(tl.int64) * (RATIO * T)
    for p in tl.static_range(RATIO):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(TAPS):
            w = tl.load(w_ptr + p * TAPS + j)
            d = tl.load(d_ptr + p * TAPS + j)
            idx = tl.minimum(tl.maximum(q + d - UP_PAD, 0), T - 1)
            acc += w * tl.load(x_row + idx, mask=live, other=0.0).to(tl.float32)
        sine = tl.sin(acc * alpha)
        z = acc + inv_beta * sine * sine
        tl.store(s_row + p * T + q, z.to(s_ptr.dtype.element_ty), mask=live)


@triton.jit
def _down(
    s_ptr, out_ptr, g_ptr, T, N,
    PAD_LEFT: tl.constexpr, STRIDE: tl.constexpr, RATIO: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = n < N
    s_row = s_ptr + row.to(tl.int64) * (RATIO * T)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(K):
        g = tl.load(g_ptr + k)
        m = tl.minimum(tl.maximum(n * STRIDE + k - PAD_LEFT, 0), RATIO * T - 1)
        acc += g * tl.load(s_row + (m % RATIO) * T + m // RATIO, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * N + n, acc.to(out_ptr.dtype.element_ty), mask=live)


class TritonSnake:
    """An `AntialiasedSnake`'s filters and SnakeBeta parameters on its device, run by the kernels."""

    def __init__(self, act: Any) -> None:  # a token2wav_fused.AntialiasedSnake
        taps = {len(t) for t in act.up_taps}
        if len(taps) != 1:
            raise ValueError(f"upsampling phases of unequal tap counts {sorted(taps)}")
        dev = act.alpha.device
        self.ratio, self.taps, self.up_pad = act.ratio, taps.pop(), act.up_pad
        self.w = torch.tensor([[w for _, w in t] for t in act.up_taps], dtype=torch.float32, device=dev)
        self.d = torch.tensor([[d for d, _ in t] for t in act.up_taps], dtype=torch.int32, device=dev)
        self.alpha = act.alpha.flatten().contiguous()
        self.inv_beta = act.inv_beta.flatten().contiguous()
        self.g = torch.tensor(act.down_taps, dtype=torch.float32, device=dev)
        self.pad_left, pad_right = act.down_pad
        self.stride = act.down_stride
        self.extra = self.pad_left + pad_right - len(act.down_taps)  # output length: see __call__

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, T] -> [B, C, N], N = (ratio * T + pads - K) // stride + 1 (as DownSample1d)."""
        x = x.contiguous()
        b, c, t = x.shape
        n = (self.ratio * t + self.extra) // self.stride + 1
        s = torch.empty(b, c, self.ratio, t, dtype=x.dtype, device=x.device)
        out = torch.empty(b, c, n, dtype=x.dtype, device=x.device)
        _up_snake[(b * c, triton.cdiv(t, BLOCK))](
            x, s, self.w, self.d, self.alpha, self.inv_beta, t, c,
            UP_PAD=self.up_pad, RATIO=self.ratio, TAPS=self.taps, BLOCK=BLOCK,
        )  # fmt: skip
        _down[(b * c, triton.cdiv(n, BLOCK))](
            s, out, self.g, t, n, PAD_LEFT=self.pad_left, STRIDE=self.stride, RATIO=self.ratio, K=len(self.g),
            BLOCK=BLOCK,
        )  # fmt: skip
        return out

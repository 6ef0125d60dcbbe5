"""token2wav's DiT block and BigVGAN's anti-aliased SnakeBeta as plain tensor functions that
`torch.compile` fuses (`Token2WavOptions.compile_dit` / `compile_vocoder`).

Why: a DiT solver step at streaming sizes was not bound by its matmuls. A block is ~35
kernels, most of them elementwise passes over [rows, frames, 1024] fp32 (modulation, gates,
residuals, the first head's RoPE); each of BigVGAN's 109 anti-aliased activations is a
replicate pad, a depthwise transposed convolution, a scale, five elementwise ops of SnakeBeta,
another pad and a depthwise convolution, each a full pass over a tensor twice the input's
length. Compiled, a block's elementwise work becomes a few fused kernels around the matmuls and
attention, and an activation two or three kernels that write the activated signal once.
Measured on an H100 (TF32, CUDA graphs, `tests/gpu/test_token2wav_graphs.py` and `benchmarks.token2wav_graphs --compile
off|all`): a solver step of 32 windows 131 -> 111 ms (its DiT-only steps 63 -> 54 ms: now
matmul-bound), the vocoder for 32 windows 410 -> 282 ms, one window's solver step 15.4 ->
11.5 ms.

- `dit_block` is `DiTDecoderLayer.forward`'s arithmetic on transformers' own submodules, with
  the block-attention mask passed in: the engine builds the 2-3 distinct masks (look-back /
  look-ahead pairs) once per velocity call instead of once per layer.
- `DiTModulation` holds every block's AdaLN modulation matrix (six dim-wide vectors from the
  time embedding) and the final norm's as rows of one matrix (`fuse_modulation`), so a velocity
  call computes all 23 modulations in one matmul from one SiLU instead of 23 of each; the
  modules' parameters become views of it (one copy of the weights). At one window a velocity
  call is ~450 kernels of 3-4 us (bound by their count, not arithmetic). Measured on an H200
  (`benchmarks.token2wav_profile`, one velocity call from its CUDA graph, one machine
  session): 1.70 -> 1.59 ms at one window with the bf16 DiT, 2.67 -> 2.45 ms in TF32; at 8 and
  32 windows within run-to-run noise (3.97 -> 3.95, 12.5 -> 13.0 ms bf16). Tried and dropped:
  q, k and v from one matmul as well. The matmuls got faster (32 windows: 4.8 -> 4.4 ms), but
  RoPE on the first head then had to join q and k again from the fused output, which was
  slower than transformers' in-place write into separate outputs (32 windows: 12.5 -> 15.3 ms a
  call, and with the in-place write on the fused output 44 ms).
- `AntialiasedSnake` computes `Qwen2_5OmniAntiAliasedActivation1d(SnakeBeta)` polyphase:
  upsampling by r with a K-tap filter is, for each of the r output phases, a K/r-tap filter
  over the input; SnakeBeta runs on each phase and the phases are interleaved (`up_snake`);
  the downsampling filter is a sum of K strided slices (`down_sample`). Replicate padding is a
  clamp of indices, so the compiled kernels never materialize a padded or zero-stuffed
  tensor. Eagerly this is slower than cuDNN's depthwise convolutions (2K slice products), so
  it runs only compiled; on CUDA as Triton kernels of its own (vocoder_triton.py).

Both are within float rounding of transformers' modules (tests/test_token2wav_fused.py: the
same functions eagerly and compiled against transformers, and the whole token2wav).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def block_masks(block_diff: torch.Tensor, layers: Any) -> list[torch.Tensor]:
    """Each layer's block-attention mask: keys within `look_backward_block` blocks before and
    `look_ahead_block` after the query's block. Built once per distinct pair; padded keys carry
    a block distance no layer reaches (see token2wav.collate), so they stay masked."""
    built: dict[tuple[int, int], torch.Tensor] = {}
    masks = []
    for layer in layers:
        key = (layer.look_backward_block, layer.look_ahead_block)
        if key not in built:
            built[key] = (block_diff >= -key[0]) & (block_diff <= key[1])
        masks.append(built[key])
    return masks


@dataclass(frozen=True, slots=True)
class DiTModulation:
    """Every block's AdaLN modulation and the final norm's in one matrix (module doc)."""

    weight: torch.Tensor  # [(6 * blocks + 2) * dim, dim]
    bias: torch.Tensor
    dim: int


def _fuse_linears(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight and bias stacking `linears`' rows; each module's parameters become views of
    them, so the weights are held once."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = torch.cat([lin.bias.detach() for lin in linears])
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = weight[start : start + n]
        lin.bias.data = bias[start : start + n]
        start += n
    return weight, bias


@torch.no_grad()
def fuse_modulation(dit: torch.nn.Module) -> DiTModulation:
    """`DiTModulation` of transformers' `Qwen2_5OmniToken2WavDiTModel`, after its last dtype or
    device move (a later `.to()` would copy the modules' parameters away from the views)."""
    linears = [b.attn_norm.linear for b in dit.transformer_blocks] + [dit.norm_out.linear]
    return DiTModulation(*_fuse_linears(linears), dit.config.hidden_size)


def modulations(w: DiTModulation, temb: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Every block's AdaLN modulation [rows, 6 * dim] and the final norm's [rows, 2 * dim] from
    the time embedding, in one matmul (transformers: `linear(silu(emb))` in each block). The
    blocks' are strided views of one output: one compiled block serves them all."""
    out = F.linear(F.silu(temb), w.weight, w.bias)
    split = out.shape[1] - 2 * w.dim
    return out[:, :split].view(out.shape[0], -1, 6 * w.dim).unbind(1), out[:, split:]


def final_norm(norm_out: torch.nn.Module, h: torch.Tensor, mod: torch.Tensor) -> torch.Tensor:
    """`Qwen2_5_OmniAdaLayerNormZero_Final.forward` with its modulation computed already."""
    scale, shift = torch.chunk(mod, 2, dim=1)
    return norm_out.norm(h) * (1 + scale)[:, None, :] + shift[:, None, :]


def dit_block(
    layer: torch.nn.Module, h: torch.Tensor, mod: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """One DiT decoder layer (`DiTDecoderLayer.forward`'s arithmetic on transformers' submodules)
    with its AdaLN modulation computed already (`modulations`)."""
    shift_msa, scale_msa, gate_msa, shift_ff, scale_ff, gate_ff = torch.chunk(mod, 6, dim=1)
    norm = layer.attn_norm.norm(h) * (1 + scale_msa[:, None]) + shift_msa[:, None]
    h = h + gate_msa[:, None] * layer.attn(hidden_states=norm, position_embeddings=(cos, sin), attention_mask=mask)
    norm = layer.ff_norm(h) * (1 + scale_ff[:, None]) + shift_ff[:, None]
    return h + gate_ff[:, None] * layer.ff(norm)


def _up_taps(up: torch.nn.Module) -> tuple[tuple[tuple[int, float], ...], ...]:
    """Per output phase p of `Qwen2_5OmniUpSample1d`: (offset d, weight) pairs such that
    out[r*q + p] = sum_d weight * x_padded[q + d], with x padded by `up.pad` on each side."""
    r, k, pad = up.ratio, up.kernel_size, up.pad
    f = up.filter.flatten().tolist()
    phases = []
    for p in range(r):
        # transformers: conv_transpose1d(x_padded, f, stride r)[n] = sum_i x_padded[i] f[n - r i],
        # sliced from pad_left: n = r q + p + pad_left, so the tap of x_padded[q + d] is
        # f[p + pad_left - r d].
        taps = [(d, r * f[j]) for d in range(-k, k + 2 * pad + 1) if 0 <= (j := p + up.pad_left - r * d) < k]
        if len(taps) != k // r or not all(0 <= d <= 2 * pad for d, _ in taps):
            raise ValueError(f"upsampling (ratio {r}, kernel {k}) has no polyphase form here")
        phases.append(tuple(taps))
    return tuple(phases)


class AntialiasedSnake:
    """`Qwen2_5OmniAntiAliasedActivation1d` with a `Qwen2_5OmniSnakeBeta`, polyphase (module doc).
    SnakeBeta's per-channel exp(alpha) and 1 / (exp(beta) + eps) are computed once here."""

    def __init__(self, module: torch.nn.Module) -> None:
        up, down, act = module.upsample, module.downsample, module.act
        self.up_taps = _up_taps(up)
        self.up_pad = up.pad
        self.ratio = up.ratio
        self.down_taps = tuple(down.filter.flatten().tolist())
        self.down_pad = (down.pad_left, down.pad_right)
        self.down_stride = down.stride
        with torch.no_grad():
            self.alpha = torch.exp(act.alpha.float())[:, None]  # [C, 1]
            self.inv_beta = (1.0 / (torch.exp(act.beta.float()) + act.no_div_by_zero))[:, None]

    def __call__(self, x: torch.Tensor, fns: tuple[Any, Any] | None = None) -> torch.Tensor:
        """`fns`: the (compiled) `up_snake` and `down_sample` to run; eager by default."""
        up, down = fns or (up_snake, down_sample)
        z = up(x, self.alpha, self.inv_beta, self.up_taps, self.up_pad)
        return down(z, self.down_taps, self.down_pad, self.down_stride)


# Two functions, compiled apart, so that the activated signal is written once and read by the
# downsampling filter. Compiled as one, inductor fused SnakeBeta into the downsampling kernel
# and evaluated it once per filter tap (12 sines per input sample): on an H200 the activations
# took 177 of the vocoder's 245 ms for 32 windows of 148 frames, their sine kernel alone 100 ms
# (benchmarks.token2wav_profile).
def up_snake(
    x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor, up_taps: tuple[tuple[tuple[int, float], ...], ...],
    up_pad: int,
) -> torch.Tensor:  # fmt: skip
    """[B, C, T] -> SnakeBeta of the upsampled signal, [B, C, ratio * T]. SnakeBeta is
    elementwise, so it runs on each phase before the phases are interleaved."""
    t = x.shape[-1]
    xp = F.pad(x, (up_pad, up_pad), mode="replicate")
    alpha, inv_beta = alpha.to(x.dtype), inv_beta.to(x.dtype)
    phases = []
    for taps in up_taps:
        z = sum(w * xp[..., d : d + t] for d, w in taps)
        phases.append(z + inv_beta * torch.sin(z * alpha) ** 2)
    return torch.stack(phases, dim=-1).flatten(-2)  # the phases interleaved


def down_sample(
    z: torch.Tensor, down_taps: tuple[float, ...], down_pad: tuple[int, int], down_stride: int
) -> torch.Tensor:
    """`Qwen2_5OmniDownSample1d`: replicate padding, then a strided low-pass filter."""
    zp = F.pad(z, down_pad, mode="replicate")
    n = (zp.shape[-1] - len(down_taps)) // down_stride + 1
    span = down_stride * (n - 1) + 1
    return sum(g * zp[..., k : k + span : down_stride] for k, g in enumerate(down_taps))  # type: ignore[return-value]


def amp_block(
    block: torch.nn.Module, acts: list[Callable[[torch.Tensor], torch.Tensor]], h: torch.Tensor
) -> torch.Tensor:
    """`Qwen2_5OmniAMPBlock.forward` with its activations as `acts` (in the block's order)."""
    for i, (conv1, conv2) in enumerate(zip(block.convs1, block.convs2, strict=True)):
        residual = h
        h = conv2(acts[2 * i + 1](conv1(acts[2 * i](h))))
        h = residual + h
    return h

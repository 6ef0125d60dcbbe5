"""code2wav's convolutional half (the upsampler and the SnakeBeta decoder after the transformer),
run incrementally: each request keeps, per convolution, the last inputs that its next outputs
read, so a chunk runs only its new frames and the output is transformers' one-shot output up
to float summation order.

Why no recomputed left context: every layer of this half is causal or pointwise, except that
each of the decoder's transposed convolutions (kernel 2r, stride r, trimmed r on each side)
mixes an input step with the next. So
- a causal convolution (stride 1, effective kernel K, left-padded with K - 1 zeros) keeps its
  last K - 1 inputs: zeros before the first chunk are exactly the one-shot padding;
- a transposed convolution (kernel k, stride s, trimmed k - s on each side) keeps its last
  floor((k - 1) / s) inputs. Its raw output sample M reads inputs floor((M - k + 1) / s) ..
  floor(M / s), so after inputs [0, b) the samples M < b s are final; a call with inputs [a, b)
  makes raw samples [a s, b s) from the kept inputs and the new ones. A stream's first call has
  nothing before it and drops the k - s trimmed samples at its start, as the one-shot pass does.
  T frames give 1920 T - 555 samples (the released rates 8, 5, 4, 3), and each later chunk of T
  frames 1920 T more: always a prefix of the one-shot output, never a sample to redo;
- SnakeBeta, the ConvNeXt blocks' norm and pointwise layers and the 1x1 convolutions are
  pointwise in time. On CUDA each SnakeBeta runs as one Triton kernel (`fused_snake`:
  snake_triton.py) rather than transformers' nine.

Before this, a chunk re-ran the whole half over 11 frames of left context (its receptive
field): 24 frames of work for a steady 12-frame chunk. Measured in benchmarks/code2wav.py.

The plan is built from transformers' modules by their classes, so a layout this file does not
know (another stride, a padded transposed convolution) fails at load, not with wrong audio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_SNAKE_BETAS = ("Qwen3OmniMoeSnakeBeta", "SnakeBeta")  # transformers' class and its deprecated alias


@dataclass(frozen=True, slots=True)
class _Step:
    """One layer of the plan: `kind` says how it runs. A layer that keeps inputs between calls
    (`keep` of them, causal: K - 1, transposed: floor((k - 1) / s)) keeps them at `offset` of
    a request's one flat state row, as [channels, keep]."""

    kind: str  # "pointwise" | "causal" | "transposed" | "convnext" | "residual"
    module: Any
    keep: int = 0
    channels: int = 0
    offset: int = 0
    snakes: tuple[Any, ...] = ()  # what runs its SnakeBetas (pointwise: the step; residual: act1, act2)

    def kept(self, state: torch.Tensor) -> torch.Tensor:
        """Its part of a batch of flat state rows [rows, size]: a [rows, channels, keep] view."""
        return state[:, self.offset : self.offset + self.channels * self.keep].view(-1, self.channels, self.keep)


def _causal_keep(net: Any) -> int:
    """Inputs a stride-1 `Qwen3OmniMoeCausalConvNet` reads before its output's own step."""
    if net.stride != 1 or net.conv.stride[0] != 1:
        raise ValueError(f"code2wav streaming: a causal convolution of stride {net.stride} is not supported")
    return net.kernel_size - 1  # the effective kernel (dilation included) less one: its left padding


def _transposed_keep(net: Any) -> int:
    """Trimmed k - s on each side (Qwen3-Omni), or on the right only (Qwen3-TTS's decoder:
    left_pad 0, no look-ahead): the kept inputs are the same, a first call trims `left_pad`."""
    k, s = net.conv.kernel_size[0], net.conv.stride[0]
    if k < s or net.left_pad not in (0, k - s) or net.right_pad != k - s:
        raise ValueError(f"code2wav streaming: a transposed convolution trimmed {net.left_pad}/{net.right_pad}")
    return (k - 1) // s


class StreamingConvs:
    """The upsampler and decoder of a `Qwen3OmniMoeCode2Wav` as a plan of streaming steps (module
    doc). `run` takes a batch of rows that are all a stream's first call or all later calls, the
    same number of new frames each, and their kept inputs; it returns the new samples and the
    inputs to keep. A request's kept inputs are one flat row (`state_size` values, 134k at the
    released size), so a batch gathers them with one stack and splits them with one unbind."""

    def __init__(self, hf: Any, fused_snake: bool = False) -> None:
        self.steps: list[_Step] = []
        self.state_size = 0
        self.fused_snake = fused_snake  # SnakeBeta as its Triton kernel (CUDA only: snake_triton.py)
        for blocks in hf.upsample:
            for block in blocks:
                self._add(block)
        for block in hf.decoder:
            self._add(block)
        # Samples of a stream's first call that the one-shot pass trims away (555 at the
        # released rates): each transposed convolution's k - s, times the upsampling after it.
        trimmed, scale = 0, 1
        for step in reversed(self.steps):
            if step.kind == "transposed":
                trimmed += step.module.left_pad * scale
                scale *= step.module.conv.stride[0]
        self.first_trim = trimmed
        self.samples_per_frame = scale

    def _add(self, m: Any) -> None:
        name = type(m).__name__

        def add(kind: str, keep: int = 0, conv: Any = None, acts: tuple[Any, ...] = ()) -> None:
            channels = conv.in_channels if keep else 0
            snakes = tuple(self._snake(a) for a in acts)
            self.steps.append(_Step(kind, m, keep, channels, self.state_size, snakes))
            self.state_size += channels * keep

        if name == "Qwen3OmniMoeCausalConvNet":
            add("causal", _causal_keep(m), m.conv)
        elif name == "Qwen3OmniMoeCausalTransConvNet":
            add("transposed", _transposed_keep(m), m.conv)
        elif name == "Qwen3OmniMoeConvNeXtBlock":
            add("convnext", _causal_keep(m.dwconv), m.dwconv.conv)
        elif name == "Qwen3OmniMoeCode2WavDecoderResidualUnit":
            if _causal_keep(m.conv2) != 0:
                raise ValueError("code2wav streaming: a residual unit's second convolution is not 1x1")
            add("residual", _causal_keep(m.conv1), m.conv1.conv, acts=(m.act1, m.act2))
        elif name == "Qwen3OmniMoeCode2WavDecoderBlock":
            for block in m.block:
                self._add(block)
        elif name in _SNAKE_BETAS:
            add("pointwise", acts=(m,))
        else:
            raise ValueError(f"code2wav streaming: no streaming form for {name}")

    def _snake(self, m: Any) -> Any:
        """What runs SnakeBeta `m`: the module itself, or its Triton kernel (`fused_snake`)."""
        if type(m).__name__ not in _SNAKE_BETAS:
            raise ValueError(f"code2wav streaming: an activation is {type(m).__name__}, not SnakeBeta")
        if not self.fused_snake:
            return m
        from omni_mp.models.qwen3_omni.snake_triton import TritonSnakeBeta

        return TritonSnakeBeta(m)

    def run(self, hidden: torch.Tensor, kept: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: [rows, channels, new frames] transformer outputs. kept: the rows' flat state
        rows [rows, state_size], or None for the rows' first call. Returns the new samples
        [rows, samples] (unclamped) and the rows' new state rows."""
        state = hidden.new_empty(hidden.shape[0], self.state_size)
        x = hidden
        for step in self.steps:
            m = step.module
            prev = None if kept is None or not step.keep else step.kept(kept)
            if step.kind == "pointwise":
                x = step.snakes[0](x)
            elif step.kind == "causal":
                x = self._causal(m, x, prev, step, state)
            elif step.kind == "transposed":
                x = self._transposed(m, x, prev, step, state)
            elif step.kind == "convnext":
                h = self._causal(m.dwconv, x, prev, step, state).permute(0, 2, 1)
                h = m.pwconv2(m.act(m.pwconv1(m.norm(h))))
                x = x + (m.gamma * h).permute(0, 2, 1)
            else:  # residual unit
                h = self._causal(m.conv1, step.snakes[0](x), prev, step, state)
                x = x + m.conv2.conv(step.snakes[1](h))
        return x[:, 0], state

    @staticmethod
    def _causal(net: Any, x: torch.Tensor, prev: torch.Tensor | None, step: _Step, state: torch.Tensor) -> torch.Tensor:
        if step.keep == 0:
            return net.conv(x)
        inp = F.pad(x, (step.keep, 0)) if prev is None else torch.cat([prev, x], dim=-1)
        step.kept(state).copy_(inp[..., -step.keep :])
        return net.conv(inp)

    @staticmethod
    def _transposed(
        net: Any, x: torch.Tensor, prev: torch.Tensor | None, step: _Step, state: torch.Tensor
    ) -> torch.Tensor:
        conv = net.conv
        s, trim, t = conv.stride[0], net.left_pad, x.shape[-1]
        if prev is None:  # the stream's first inputs: as the one-shot pass, less its unfinished tail
            if step.keep:  # inputs before the first are none, which adds what zeros add
                step.kept(state).copy_(F.pad(x, (max(0, step.keep - t), 0))[..., -step.keep :])
            return conv(x)[..., trim : t * s]
        inp = torch.cat([prev, x], dim=-1)
        step.kept(state).copy_(inp[..., -step.keep :])
        return conv(inp)[..., step.keep * s : (step.keep + t) * s]

"""Streaming windows over a request's input ids, and the joining of their outputs.

Chunk k emits the output of ids [start_k, end_k): a small first chunk, then fixed-size
chunks, or chunks that double up to a cap (`StreamingConfig.chunk_at`). Its trajectory is
solved on the window [start_k - left, end_k + right) (clipped to the input), whose start is a
multiple of the model's block alignment, so the window's attention blocks coincide with the
one-shot pass's. The noise of every frame is the one-shot noise of that frame (see
runner.NoiseStream), so a window differs from the one-shot pass only through what it cannot
see beyond its edges.

Joining: a chunk holds back its last `crossfade` samples; the next chunk renders those
samples too (they lie in its left context) and the two are crossfaded linearly, so a
boundary never jumps between two independently computed samples.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from omni_mp.engines.diffusion.params import StreamingConfig


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    index: int
    window_start: int
    window_end: int
    emit_start: int
    emit_end: int
    last: bool


def check_streaming(cfg: StreamingConfig, align: int, samples_per_input: int, sample_rate: int) -> int:
    """Validate the sizes against the model; returns the crossfade length in samples."""
    for name in ("first_chunk", "chunk", "max_chunk", "left_context", "right_context"):
        if getattr(cfg, name) % align:
            raise ValueError(f"streaming.{name}: must be a multiple of the model's block alignment ({align} ids)")
    if cfg.max_chunk and cfg.max_chunk < cfg.chunk:
        raise ValueError("streaming.max_chunk: smaller than chunk (0 turns growing chunks off)")
    crossfade = round(cfg.crossfade_ms * sample_rate / 1000)
    if crossfade > cfg.left_context * samples_per_input:
        raise ValueError("streaming.crossfade_ms: longer than the left context")
    if crossfade > min(cfg.first_chunk, cfg.chunk) * samples_per_input:
        raise ValueError("streaming.crossfade_ms: longer than a chunk")
    return crossfade


def next_chunk(cfg: StreamingConfig, index: int, emitted: int, known: int, closed: bool) -> ChunkPlan | None:
    """The plan of chunk `index` (its output starts at id `emitted`), or None while the ids
    it needs (right context included) have not all arrived. `known` ids have arrived;
    `closed`: no more will come."""
    end = emitted + cfg.chunk_at(index)
    if closed and known <= end + cfg.right_context // 2:
        # The rest fits (a tail shorter than half the right context joins this chunk).
        end = known
    elif not closed and known < end + cfg.right_context:
        return None
    last = closed and end >= known
    return ChunkPlan(
        index=index,
        window_start=max(0, emitted - cfg.left_context),
        window_end=min(known, end + cfg.right_context),
        emit_start=emitted,
        emit_end=end,
        last=last,
    )


def streamed_window_lengths(cfg: StreamingConfig, left: int | None = None, right: int | None = None) -> tuple[int, ...]:
    """The window lengths (in ids) of a stream's chunks before its last one, in the order they
    first occur, the steady-state window last. No chunk's window is longer than the longest of
    them (a last chunk's window ends at `known`, at most `right_context // 2` past the chunk
    instead of `right_context`, so it is at most its index's). Closed form of `next_chunk` on a
    stream whose ids keep arriving: chunk 0 is [0, first + right), chunk k >= 1 starts at e_k
    (the sizes of the chunks before it) and spans min(e_k, left) + chunk_at(k) + right ids;
    from the chunk where e_k >= left and the size has settled, every window is the steady one.
    `left` / `right`: at most this much context of the window is kept (`decode_span`'s lengths)."""
    left = cfg.left_context if left is None else min(left, cfg.left_context)
    right = cfg.right_context if right is None else min(right, cfg.right_context)
    lengths = [cfg.first_chunk + right]
    emitted, index = cfg.first_chunk, 1
    while True:
        size = cfg.chunk_at(index)
        n = min(emitted, left) + size + right
        if n not in lengths:
            lengths.append(n)
        if emitted >= left and size == cfg.steady_chunk():
            break
        emitted += size
        index += 1
    steady = lengths.pop(lengths.index(left + cfg.steady_chunk() + right))
    return (*lengths, steady)


def decode_span(plan: ChunkPlan, context: tuple[int, int], hold: int) -> ChunkPlan:
    """The part of a solved window its decoder runs on: the emitted ids, `context` (left, right)
    ids around them (the decoder's own reach: what its emitted output depends on), and `hold`
    more ids before them, whose samples the crossfade with the chunk before reads. Clipped to
    the window. The decoder then skips the rest of the window's context, which only the
    solver needed."""
    left, right = context
    return replace(
        plan,
        window_start=max(plan.window_start, plan.emit_start - left - hold),
        window_end=min(plan.window_end, plan.emit_end + right),
    )


def one_shot(known: int) -> ChunkPlan:
    return ChunkPlan(index=0, window_start=0, window_end=known, emit_start=0, emit_end=known, last=True)


class Joiner:
    """Turns a request's chunk outputs (in order) into the samples to emit."""

    def __init__(self, samples_per_input: int, crossfade: int) -> None:
        self.spi = samples_per_input
        self.crossfade = crossfade
        self.tail: torch.Tensor | None = None  # held-back last samples of the previous chunk

    def push(self, plan: ChunkPlan, window_out: torch.Tensor) -> torch.Tensor:
        a = (plan.emit_start - plan.window_start) * self.spi
        b = (plan.emit_end - plan.window_start) * self.spi
        body = window_out[a:b]
        if self.tail is not None:
            n = self.tail.numel()
            head = window_out[a - n : a]
            ramp = torch.arange(1, n + 1, dtype=body.dtype) / (n + 1)
            body = torch.cat([self.tail * (1 - ramp) + head * ramp, body])
            self.tail = None
        if plan.last or not self.crossfade:
            return body
        self.tail = body[-self.crossfade :].clone()
        return body[: -self.crossfade]

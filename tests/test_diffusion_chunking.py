"""Streaming windows and joining (no model): plans tile the input, windows are block-aligned and
carry their context, and the joiner emits exactly one sample per input sample position."""

from __future__ import annotations

import pytest
import torch

from omni_mp.engines.diffusion.chunking import (
    ChunkPlan,
    Joiner,
    check_streaming,
    decode_span,
    next_chunk,
    streamed_window_lengths,
)
from omni_mp.engines.diffusion.params import StreamingConfig

CFG = StreamingConfig()
GROWING = StreamingConfig(first_chunk=12, chunk=24, max_chunk=96)  # 12, then 24, 48, 96, 96, ...
ALIGN = 12


def plans(total: int, per_arrival: int, cfg: StreamingConfig = CFG) -> list[ChunkPlan]:
    """Plan chunks while ids arrive `per_arrival` at a time (the upstream rate)."""
    out: list[ChunkPlan] = []
    known, emitted = 0, 0
    while not out or not out[-1].last:
        known = min(total, known + per_arrival)
        while (p := next_chunk(cfg, len(out), emitted, known, known == total)) is not None:
            out.append(p)
            emitted = p.emit_end
            if p.last:
                break
    return out


@pytest.mark.parametrize("cfg", [CFG, GROWING], ids=["fixed", "growing"])
@pytest.mark.parametrize("total", [1, 11, 24, 30, 37, 72, 100, 150, 301])
@pytest.mark.parametrize("per_arrival", [1, 7, 1000])
def test_plans_tile_the_input_with_aligned_windows(total: int, per_arrival: int, cfg: StreamingConfig) -> None:
    ps = plans(total, per_arrival, cfg)
    assert ps[0].emit_start == 0 and ps[-1].emit_end == total and ps[-1].last
    assert all(not p.last for p in ps[:-1])
    for a, b in zip(ps, ps[1:], strict=False):
        assert a.emit_end == b.emit_start  # contiguous, no overlap
    for p in ps:
        assert p.window_start % ALIGN == 0  # attention blocks coincide with the one-shot pass's
        assert p.window_start == max(0, p.emit_start - cfg.left_context)
        assert p.window_end == min(total, p.emit_end + cfg.right_context) or p.last
        assert p.window_start <= p.emit_start < p.emit_end <= p.window_end
    # Chunk sizes: each chunk's own (a small first chunk, then regular or growing ones), the last
    # may take a short tail.
    for p in ps:
        size = p.emit_end - p.emit_start
        assert size == cfg.chunk_at(p.index) or (p.last and size <= cfg.chunk_at(p.index) + cfg.right_context // 2)


def test_growing_chunks_double_up_to_the_cap() -> None:
    assert [GROWING.chunk_at(k) for k in range(7)] == [12, 24, 48, 96, 96, 96, 96]
    assert GROWING.chunk_at(10**6) == 96 and GROWING.steady_chunk() == 96 == GROWING.largest_chunk()
    assert [CFG.chunk_at(k) for k in range(4)] == [24, 48, 48, 48]  # max_chunk 0: fixed
    ps = plans(400, 1000, GROWING)
    assert [p.emit_end - p.emit_start for p in ps][:5] == [12, 24, 48, 96, 96]


@pytest.mark.parametrize(
    "cfg",
    [
        CFG,
        StreamingConfig(first_chunk=12, chunk=12, left_context=48),
        StreamingConfig(first_chunk=96, left_context=0),
        GROWING,
        StreamingConfig(first_chunk=12, chunk=12, max_chunk=60, left_context=96),  # the cap before the context
    ],
)
def test_streamed_window_lengths_are_the_windows_streams_get(cfg: StreamingConfig) -> None:
    """What the graph warm-up plans for: every chunk before a stream's last has one of these
    window lengths (each occurs), the steady one listed last, and no window is longer."""
    lengths = streamed_window_lengths(cfg)
    seen: set[int] = set()
    for total in (1, 11, 24, 30, 37, 72, 100, 150, 301, 700):
        for per_arrival in (1, 7, 1000):
            ps = plans(total, per_arrival, cfg)
            seen.update(p.window_end - p.window_start for p in ps[:-1])
            assert all(p.window_end - p.window_start <= max(lengths) for p in ps)
    assert seen == set(lengths) and len(lengths) == len(seen)
    assert lengths[-1] == cfg.left_context + cfg.steady_chunk() + cfg.right_context


@pytest.mark.parametrize("cfg", [CFG, GROWING], ids=["fixed", "growing"])
@pytest.mark.parametrize(("reach", "hold"), [((13, 13), 1), ((5, 3), 0), ((40, 40), 2)])
def test_decode_spans_keep_the_emitted_ids_and_their_reach(
    cfg: StreamingConfig, reach: tuple[int, int], hold: int
) -> None:
    """A decoder that reaches `reach` ids decodes the emitted ids with that much context (and
    `hold` ids for the crossfade), clipped to the window; the warm-up's lengths are theirs."""
    lengths = streamed_window_lengths(cfg, reach[0] + hold, reach[1])
    seen: set[int] = set()
    for total in (1, 30, 37, 100, 301, 700):
        for p in plans(total, 7, cfg):
            s = decode_span(p, reach, hold)
            assert (s.emit_start, s.emit_end, s.last, s.index) == (p.emit_start, p.emit_end, p.last, p.index)
            assert p.window_start <= s.window_start <= s.emit_start and s.emit_end <= s.window_end <= p.window_end
            assert s.window_start == max(p.window_start, p.emit_start - reach[0] - hold)
            assert s.window_end == min(p.window_end, p.emit_end + reach[1])
            if not p.last:
                seen.add(s.window_end - s.window_start)
    assert seen == set(lengths)
    assert lengths[-1] == min(cfg.left_context, reach[0] + hold) + cfg.steady_chunk() + min(cfg.right_context, reach[1])


def test_a_chunk_waits_for_its_right_context_unless_the_input_is_complete() -> None:
    assert next_chunk(CFG, 0, 0, CFG.first_chunk + CFG.right_context - 1, closed=False) is None
    assert next_chunk(CFG, 0, 0, CFG.first_chunk + CFG.right_context, closed=False) is not None
    assert next_chunk(CFG, 0, 0, CFG.first_chunk + 1, closed=True) is not None


def test_joiner_emits_every_sample_once_and_crossfades_the_seams() -> None:
    spi, crossfade = 480, check_streaming(CFG, ALIGN, 480, 24000)
    assert crossfade == 240
    total = 150
    signal = torch.randn(total * spi)
    joiner, out = Joiner(spi, crossfade), []
    for p in plans(total, 1000):
        window = signal[p.window_start * spi : p.window_end * spi]
        out.append(joiner.push(p, window))
    # Windows that agree with the signal join back to it exactly (the crossfade mixes equal values).
    torch.testing.assert_close(torch.cat(out), signal)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("first_chunk", 20, "first_chunk"),
        ("left_context", 6, "left_context"),
        ("left_context", 0, "crossfade_ms: longer than the left context"),
        ("max_chunk", 30, "max_chunk: must be a multiple"),
        ("max_chunk", 36, "max_chunk: smaller than chunk"),
    ],
)
def test_streaming_sizes_are_checked_against_the_model(field: str, value: object, message: str) -> None:
    import msgspec

    cfg = msgspec.structs.replace(CFG, **{field: value})
    with pytest.raises(ValueError, match=message):
        check_streaming(cfg, ALIGN, 480, 24000)

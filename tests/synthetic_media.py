"""Deterministic media for Qwen2.5-Omni prompts (the CPU tests and tests/gpu)."""

from __future__ import annotations

import math

import numpy as np

from benchmarks.common.speech import speechlike  # noqa: F401  (the realtime tests' voice)


def tone(seconds: float = 2.0, rate: int = 16_000) -> np.ndarray:
    """A chirp, float32 in [-0.3, 0.3]."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * math.pi * (220 + 110 * t) * t)).astype(np.float32)


def pattern(size: int = 56) -> np.ndarray:
    """A colour gradient, uint8 [size, size, 3]."""
    y, x = np.mgrid[0:size, 0:size]
    return np.stack([(x * 4) % 256, (y * 4) % 256, ((x + y) * 2) % 256], axis=-1).astype(np.uint8)

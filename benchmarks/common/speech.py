"""A synthetic voice for the realtime runs and tests: vowel syllables that Silero VAD takes
for speech, made here (no recording to ship or fetch)."""

from __future__ import annotations

import math

import numpy as np

# Formants (Hz, bandwidth Hz) of five vowels: what makes `speechlike` read as a voice.
_VOWELS = {
    "a": ((730, 90), (1090, 110), (2440, 170)),
    "i": ((270, 60), (2290, 100), (3010, 120)),
    "u": ((300, 60), (870, 90), (2240, 120)),
    "e": ((530, 70), (1840, 100), (2480, 120)),
    "o": ((570, 70), (840, 90), (2410, 120)),
}


def _resonate(x: np.ndarray, freq: float, bandwidth: float, rate: int) -> np.ndarray:
    """A two-pole resonator (one formant) over `x` (no scipy here: a plain loop, ~0.1 s/s)."""
    r = math.exp(-math.pi * bandwidth / rate)
    a1, a2, g = -2 * r * math.cos(2 * math.pi * freq / rate), r * r, 1 - r
    y = np.zeros(len(x))
    y1 = y2 = 0.0
    for k, v in enumerate(x.tolist()):
        y0 = g * v - a1 * y1 - a2 * y2
        y[k], y2, y1 = y0, y1, y0
    return y


def speechlike(syllables: str = "aieouaeio", rate: int = 24_000, syllable_s: float = 0.25) -> np.ndarray:
    """Vowel syllables from a glottal pulse train (~110-130 Hz) through three formants: a voice
    to Silero VAD (probability > 0.5 through it, < 0.05 in silence: measured), float32 in
    [-0.3, 0.3]. Deterministic, no recording needed."""
    parts = []
    for k, v in enumerate(syllables):
        n = int(syllable_s * rate)
        t = np.arange(n) / rate
        f0 = (110 + 20 * math.sin(k)) * (1 + 0.08 * np.sin(2 * math.pi * 3 * t))
        phase = np.cumsum(f0) / rate
        y = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
        for freq, bw in _VOWELS[v]:
            y = _resonate(y, freq, bw, rate)
        y *= np.sin(np.pi * np.arange(n) / n) ** 0.5
        parts.append(0.3 * y / np.abs(y).max())
    return np.concatenate(parts).astype(np.float32)

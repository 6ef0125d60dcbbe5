"""Percentiles. The runners have used three definitions; each keeps its own (a change would
move published figures), under a name that says which it is."""

from __future__ import annotations

import math
import statistics


def percentile(xs: list[float], q: float) -> float:
    """The value at index round(q x (n - 1)) of the sorted values (the omni benchmarks')."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def percentile_nearest_rank(xs: list[float], q: float) -> float:
    """The nearest-rank percentile: the value at rank ceil(q x n) (benchmarks.image_gpu's)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def percentile_inclusive(xs: list[float], q: int) -> float:
    """The q-th percentile (q in 1..99) interpolated between values, `statistics.quantiles`'
    inclusive method (benchmarks.http_serving's); one value is its own percentile."""
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]

"""Progress lines, phase errors and small formatting helpers of the benchmark reports."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def make_say(name: str) -> Callable[[str], None]:
    """A progress printer: `[name] msg`, flushed (the runners' output is read live)."""

    def say(msg: str) -> None:
        print(f"[{name}] {msg}", flush=True)

    return say


def phase_error(e: BaseException, limit: int = 2000) -> str:
    """A phase's exception for the report: its start (what failed) and its end (a stage's log
    tail ends with the exception that stopped it), at most `limit` characters."""
    text = f"{type(e).__name__}: {e}"
    if len(text) <= limit:
        return text
    head = limit // 5
    return f"{text[:head]} [...] {text[-(limit - head) :]}"


def pyplot() -> Any | None:
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is missing (the GPU hosts'
    images have it; a report says when a plot could not be drawn)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def ms(seconds: float | None) -> str:
    """Seconds as whole milliseconds ("-" for none)."""
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def fmt(x: Any, spec: str = "{:.3f}") -> str:
    """`x` in `spec`, "-" for None or NaN."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)

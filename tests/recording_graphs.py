"""A stand-in for the diffusion runner's `GraphSet` on a CPU, where CUDA graphs cannot be
captured: it records the graph keys a runner or model would capture (`ready`, the start-up
warm-up) and replay (each call), and runs every call eagerly. The tests check with it that a
stream's padded calls only use shapes warmed up at start-up; capture and replay themselves are
checked on a GPU (tests/gpu/test_token2wav_graphs.py, tests/gpu/test_code2wav_graphs.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni_mp.engines.diffusion.graphs import _signature


class _Recorder:
    """A ShapeGraphs stand-in: records the graph key (`graphs._signature` of the arguments,
    what ShapeGraphs keys its graphs by) of each warm-up capture and of each call; runs eagerly."""

    def __init__(self, fn: Callable[..., Any], max_graphs: int) -> None:
        self.fn, self.max_graphs = fn, max_graphs
        self.warmed: set[Any] = set()
        self.calls: list[Any] = []

    def ready(self, *args: Any) -> bool:
        if len(self.warmed) >= self.max_graphs:
            return False
        self.warmed.add(tuple(_signature(a) for a in args))
        return True

    def __call__(self, *args: Any) -> Any:
        self.calls.append(tuple(_signature(a) for a in args))
        return self.fn(*args)


class RecordingGraphs:
    """The runner's view of a GraphSet (`wrap`, `max_graphs`), recording instead of capturing."""

    def __init__(self, max_graphs: int = 64) -> None:
        self.max_graphs = max_graphs
        self.members: dict[str, _Recorder] = {}

    def wrap(self, fn: Callable[..., Any], name: str) -> _Recorder:
        self.members[name] = _Recorder(fn, self.max_graphs)
        return self.members[name]

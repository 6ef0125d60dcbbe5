"""CUDA graphs of a diffusion model's pure tensor functions, one per input shape (no vLLM imports).

A DiT step at streaming sizes is a few hundred small kernels: eager, it is bound by kernel
launches, and next to other processes' work on the same GPU every launch waits its turn. A
graph replays the whole call as one launch. The runner pads a step's batch to a bucket
(batch size from a fixed list, frames to a multiple of the model's `graph_frame_step`) so a
few graphs serve every step; padded rows and frames are masked by the model, and the real
rows' outputs are the eager pass's at that padded shape (the graph replays its kernels).

`ShapeGraphs(fn)` is `fn` with arguments that are tensors or dataclasses of tensors (any
other field must be hashable and is part of the key): the first call of a shape warms up on
a side stream and captures a graph; later calls copy the arguments into the graph's static
inputs (a dataclass argument only when it is another object than last time: a step's
conditioning is loaded once for its several model calls) and replay. Outputs are cloned, so
a result stays valid across replays. All graphs of one runner share one memory pool. Shapes
past `max_graphs`, or whose capture fails, run eagerly. `ready(*args)` captures a shape ahead
of use (the runner's start-up warm-up). CUDA only: on a CPU nothing here runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger("omni_mp.diffusion")

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def bucket(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size >= n, or None when n is larger than every size."""
    return next((b for b in sorted(sizes) if b >= n), None)


def buckets_upto(n: int, sizes: Sequence[int]) -> list[int]:
    """The buckets a batch of at most n rows can be padded to: every size up to n's bucket (all
    of them when n is past the largest)."""
    top = bucket(n, sizes) or max(sizes)
    return [b for b in sorted(sizes) if b <= top]


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _signature(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return ("t", tuple(arg.shape), arg.dtype, arg.device)
    if dataclasses.is_dataclass(arg):
        return (type(arg), tuple((f.name, _signature(getattr(arg, f.name))) for f in dataclasses.fields(arg)))
    return ("v", arg)


def _static(arg: Any) -> Any:
    """A fresh copy of `arg` (tensors cloned, contiguous) whose tensors are the graph's inputs."""
    if isinstance(arg, torch.Tensor):
        return arg.clone(memory_format=torch.contiguous_format)
    if dataclasses.is_dataclass(arg):
        return dataclasses.replace(arg, **{f.name: _static(getattr(arg, f.name)) for f in dataclasses.fields(arg)})  # type: ignore[type-var]
    return arg


def _load(static: Any, arg: Any) -> None:
    if isinstance(static, torch.Tensor):
        static.copy_(arg)
    elif dataclasses.is_dataclass(static):
        for f in dataclasses.fields(static):
            _load(getattr(static, f.name), getattr(arg, f.name))


def _clone(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone()
    return type(out)(_clone(o) for o in out)


@dataclasses.dataclass(frozen=True, slots=True)
class GraphWarmup:
    """What a runner's start-up capture did (shown on the stage's Ready line)."""

    graphs: int
    seconds: float


@dataclasses.dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Any, ...]
    output: Any
    loaded: list[Any]  # per argument: the object whose values the static input holds (dataclasses)


class ShapeGraphs:
    """`fn` replayed from one CUDA graph per argument shape (see the module doc)."""

    def __init__(self, fn: Callable[..., Any], name: str, max_graphs: int = 64, pool: Any = None) -> None:
        self.fn = fn
        self.name = name
        self.max_graphs = max_graphs
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.graphs: dict[Any, _Graph] = {}
        self.failed: set[Any] = set()
        self.replays = 0
        self.eager_calls = 0

    def ready(self, *args: Any) -> bool:
        """Capture the graph of these arguments' shapes now, if it is not there yet (start-up
        warm-up: a first capture inside a request's step stalls it). False: it runs eagerly."""
        key = tuple(_signature(a) for a in args)
        if key in self.graphs:
            return True
        if key in self.failed or len(self.graphs) >= self.max_graphs:
            return False
        return self._capture(key, args) is not None

    def __call__(self, *args: Any) -> Any:
        key = tuple(_signature(a) for a in args)
        g = self.graphs.get(key)
        if g is None:
            if key in self.failed or len(self.graphs) >= self.max_graphs:
                self.eager_calls += 1
                return self.fn(*args)
            g = self._capture(key, args)
            if g is None:
                self.eager_calls += 1
                return self.fn(*args)
        for i, (static, arg) in enumerate(zip(g.inputs, args, strict=True)):
            if dataclasses.is_dataclass(arg):
                if g.loaded[i] is arg:
                    continue  # this step's conditioning is already there
                g.loaded[i] = arg
            _load(static, arg)
        g.graph.replay()
        self.replays += 1
        return _clone(g.output)

    def _capture(self, key: Any, args: tuple[Any, ...]) -> _Graph | None:
        inputs = tuple(_static(a) for a in args)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: lazy inits (cuBLAS handles, workspaces) outside capture
                for _ in range(2):
                    self.fn(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                output = self.fn(*inputs)
        except Exception:  # noqa: BLE001 - this shape runs eagerly from now on; the engine keeps serving
            log.exception("%s: CUDA graph capture failed for %s; running it eagerly", self.name, key)
            self.failed.add(key)
            torch.cuda.synchronize()
            return None
        g = _Graph(graph, inputs, output, [None] * len(args))
        self.graphs[key] = g
        log.info("%s: captured a CUDA graph (%d in all)", self.name, len(self.graphs))
        return g


class GraphSet:
    """The graphs of one runner: one memory pool (replays never overlap: one step at a time)."""

    def __init__(self, max_graphs: int) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.max_graphs = max_graphs
        self.members: list[ShapeGraphs] = []

    def wrap(self, fn: Callable[..., Any], name: str) -> ShapeGraphs:
        g = ShapeGraphs(fn, name, self.max_graphs, self.pool)
        self.members.append(g)
        return g

    def stats(self) -> dict[str, tuple[int, int, int]]:
        """name -> (graphs, replays, eager calls)."""
        return {g.name: (len(g.graphs), g.replays, g.eager_calls) for g in self.members}

"""What a diffusion model gives the engine: conditioning, one batched velocity evaluation, decode.

The engine owns everything else: noise (one CPU generator per request, drawn in frame order
so a streamed window gets the same noise as the one-shot pass), the ODE solver and its time
grid, continuous batching, streaming windows and output joining. A model sees a batch of
trajectories, each a state of shape [frames, state_dim] with its own conditioning, time and
guidance: frames are per input id (`frames_per_input`), so sequence models of different
lengths share a step (padded; the model masks the padding). An image DiT fits the same
interface with a fixed number of "frames" (latent patches) per request and no streaming:
such a model also implements `RequestModel` (its requests carry their own inputs and
parameters, not codec ids; it makes each trajectory's start, grid and output itself).

A model with no solver (a causal codec decoder such as Qwen3-Omni's code2wav) is a
`WindowDecoder`: the same engine admits, batches, streams and joins its windows, and decodes
each window straight from its inputs in the step that admits it (no noise, no time grid).
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from omni_mp.engines.diffusion.params import DiffusionParams

if TYPE_CHECKING:
    from omni_mp.engines.base import StageInput


class DiffusionInputError(ValueError):
    """A request's input cannot be sampled (unknown speaker, id out of range, empty input...)."""


@dataclass(frozen=True, slots=True)
class Window:
    """The inputs one trajectory is conditioned on: ids [start, start + len(ids)) of its request."""

    request_id: str
    ids: torch.Tensor  # int64 [n]
    start: int
    params: DiffusionParams | Any  # resolved (seed and speaker set); a RequestModel's own params
    inputs: Any = None  # a RequestModel's request inputs (what its `parse` made)


class DiffusionModel(Protocol):
    sample_rate: int  # output samples per second
    samples_per_input: int  # output samples per input id
    frames_per_input: int  # state frames per input id
    state_dim: int  # features per state frame
    window_align: int  # streaming windows start at multiples of this many inputs
    max_frames: int  # the longest state the model can take (positional limit)
    device: torch.device
    # Optional, read with getattr: `decode_context: tuple[int, int]`, the (left, right) ids
    # around an emitted range that `decode`'s output there depends on. The runner then decodes
    # only that span of a streamed window (chunking.decode_span), not the solver's whole context.

    def check(self, params: DiffusionParams, ids: Sequence[int]) -> None:
        """Raise DiffusionInputError naming what is wrong with a request's input."""
        ...

    def condition(self, window: Window) -> Any:
        """Everything about a trajectory that stays fixed over its solve (computed once)."""
        ...

    def collate(self, conds: Sequence[Any], guidance: torch.Tensor) -> Any:
        """The batch of one solver step: conditioning padded to the longest state, masks."""
        ...

    def velocity(self, batch: Any, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """One (guided) model evaluation: x [B, S, state_dim] at times t [B] -> dx/dt, same shape."""
        ...

    def decode(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Final states [frames, state_dim] -> outputs (audio: float32 [samples] on the CPU)."""
        ...


@runtime_checkable
class PartedVelocity(Protocol):
    """A model whose velocity can run in parts (an image DiT's blocks, a few at a time): the
    engine then runs an Euler step one part per engine step, and between parts takes in new
    requests (see `DiffusionStageConfig.restart_step_before`)."""

    def velocity_parts(self, batch: Any, x: torch.Tensor, t: torch.Tensor) -> Generator[float, None, torch.Tensor]:
        """`velocity` as a generator: yields the fraction of the work done after each part
        but the last, and returns the velocity."""
        ...


def run_parts(parts: Generator[float, None, torch.Tensor]) -> torch.Tensor:
    """Run a parted velocity to its end."""
    while True:
        try:
            next(parts)
        except StopIteration as stop:
            return stop.value


@dataclass(frozen=True, slots=True)
class TrajectoryStart:
    """How a RequestModel's trajectory starts: its state, time grid and solver."""

    x: torch.Tensor  # [frames, state_dim] on the model's device
    grid: torch.Tensor  # fp32 time points, any device (a solver step goes from grid[k] to grid[k + 1])
    guidance: float
    solver: str  # a key of omni_mp.engines.diffusion.solver.SOLVERS
    group: Hashable = None  # only trajectories of one group share a model call (e.g. one image size)
    preview_every: int = 0  # > 0: render the state after every this many steps (not the last) as a preview


@dataclass(frozen=True, slots=True)
class Preview:
    """A RequestModel's output rendered part-way through a trajectory, after `step` steps."""

    out: torch.Tensor
    step: int


@runtime_checkable
class RequestModel(Protocol):
    """A diffusion model whose requests carry their own inputs and parameters instead of codec
    ids (an image DiT: the prompt's hidden rows and the image's size, steps, seed): one
    trajectory per request over its whole input, no streaming."""

    def check_params(self, params: dict[str, Any] | None) -> None:
        """Raise DiffusionInputError on parameters this model cannot serve (cheap: before any work)."""
        ...

    def parse(self, stage_input: StageInput, seed: int | None) -> tuple[Any, Any]:
        """(resolved params, inputs) of a request; `seed`: the request's sampling seed (None:
        its params' or a random one). Raises DiffusionInputError."""
        ...

    def start(self, window: Window) -> TrajectoryStart: ...

    def render(self, conds: Sequence[Any], states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Final states -> outputs (`decode`, given each trajectory's conditioning)."""
        ...

    def output_info(self, out: torch.Tensor | Preview) -> dict[str, Any]:
        """A rendered output (final, or a Preview) -> the AdditionalInformation of its chunk."""
        ...


@runtime_checkable
class WindowDecoder(Protocol):
    """A model with no solver: a window's output is a function of its inputs (and of what the
    model keeps of the request's earlier windows, which reach it in order, one per request per
    call). The runner calls `release` when a request ends, however it ends."""

    sample_rate: int
    samples_per_input: int
    frames_per_input: int  # for the engine's length check against max_frames
    window_align: int
    max_frames: int
    device: torch.device

    def check(self, params: DiffusionParams, ids: Sequence[int]) -> None: ...

    def condition(self, window: Window) -> Any:
        """Check and convert one window (DiffusionInputError fails its request alone)."""
        ...

    def decode_windows(self, conds: Sequence[Any]) -> list[torch.Tensor]:
        """The windows of one step, batched -> their outputs (float32 [samples], CPU), from each
        window's first input on."""
        ...

    def release(self, request_id: str) -> None: ...

    # Optional, for CUDA graphs (the runner calls them where the model has them):
    #   use_graphs(graphs: GraphSet, row_buckets: Sequence[int]) -> None: graph its own calls;
    #   warm_up_graphs(streaming: StreamingConfig, rows: Sequence[int]) -> int: capture what a
    #   stream's steps replay at these row buckets; returns how many graphs are ready.

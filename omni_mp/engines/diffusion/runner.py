"""Worker-side state and execution of the diffusion engine (no vLLM imports; the vLLM worker
class in `vllm_hooks_diffusion` delegates here).

Holds every running trajectory (its state, conditioning and time grid) like an AR worker
holds KV cache, and per request the noise stream and the output joiner. `execute` runs one
solver step over the scheduled trajectories (grouped by solver; rows padded to the longest
state), decodes those that reached t = 1, and joins their output into the request's stream.

Per-step host work is kept off the solver's path: a group's conditioning is collated once and
its padded state kept while the same trajectories step together (rebuilt when one joins or
leaves), time pairs go to the device in one copy, and nothing waits for the device. With
`graphs` (CUDA) and a model that declares `graph_frame_step`, a step's batch is padded to a
bucket (batch size from `graph_batch_sizes`, frames to a multiple of the model's step, up to
`graph_max_frames`) and its velocity replayed from a CUDA graph of that bucket (`graphs.py`);
other steps, and every step on a CPU, run eagerly at their own size.

A model whose velocity runs in parts (`PartedVelocity`, an image DiT's blocks a few at a
time) takes an Euler step over several engine steps, one part each, so the stage takes in
new requests between parts: one admitted early in its group's step restarts that step with it
(`restart_step_before`), otherwise it joins the group's next step.

A `WindowDecoder` (no solver) has no trajectories: its windows are decoded, batched, in the
step that admits them. One with `use_graphs` (code2wav) pads and replays its own calls from
the runner's graphs, and says at warm-up which shapes a stream's steps use.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from omni_mp.engines.diffusion.batcher import StepPlan, StepResult, TrajectorySpec
from omni_mp.engines.diffusion.chunking import ChunkPlan, Joiner, decode_span, streamed_window_lengths
from omni_mp.engines.diffusion.graphs import DEFAULT_BATCH_SIZES, GraphSet, GraphWarmup, bucket, buckets_upto, round_up
from omni_mp.engines.diffusion.model import (
    DiffusionModel,
    PartedVelocity,
    Preview,
    RequestModel,
    Window,
    WindowDecoder,
)
from omni_mp.engines.diffusion.params import DiffusionParams, StreamingConfig
from omni_mp.engines.diffusion.solver import SOLVERS, euler_update, time_grid

log = logging.getLogger("omni_mp.diffusion")


class NoiseStream:
    """A request's initial noise, frame by frame from one CPU generator seeded with the
    request's seed: frames are drawn in order whatever the windows, so window [a, b) gets the
    frames a one-shot `torch.randn([1, n, dim], generator)` would have there (CPU normal
    sampling is prefix-consistent; the streaming tests check it), on any device."""

    def __init__(self, seed: int, dim: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.dim = dim
        self.frames = torch.empty(0, dim)

    def take(self, start: int, end: int) -> torch.Tensor:
        if end > self.frames.shape[0]:
            more = torch.randn(1, end - self.frames.shape[0], self.dim, generator=self.gen)[0]
            self.frames = torch.cat([self.frames, more])
        return self.frames[start:end]


@dataclass
class _Trajectory:
    request_id: str
    plan: ChunkPlan
    cond: object
    x: torch.Tensor  # [frames, state_dim] on the model's device
    grid: list[float]  # time points (fp32 values)
    guidance: float
    solver: str
    group: object = None  # trajectories share a model call only within a group (and solver)
    preview_every: int = 0  # RequestModel trajectories: render a preview after every this many steps
    k: int = 0  # solver steps taken


@dataclass
class _PartedStep:
    """An Euler step of a group in flight: its velocity's remaining parts."""

    parts: Generator[float, None, torch.Tensor]
    t0: torch.Tensor
    t1: torch.Tensor
    done: float = 0.0  # fraction of the velocity's work run so far


@dataclass
class _Group:
    """Trajectories of one solver stepping together: their collated conditioning and padded
    state, kept while the same trajectories step together."""

    key: tuple[int, ...]  # trajectory ids, in row order (unique: the batcher never reuses one)
    batch: Any
    x: torch.Tensor  # [rows, frames, state_dim], padded (to a graph bucket when graphed)
    graphed: bool
    step: _PartedStep | None = None  # a parted step in flight over `key`


class DiffusionRunner:
    def __init__(
        self,
        model: DiffusionModel | WindowDecoder,
        crossfade: int,
        graphs: GraphSet | None = None,
        graph_batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        graph_max_frames: int = 512,
        restart_step_before: float = 0.5,
    ) -> None:
        """`graphs`: CUDA graphs for models that declare `graph_frame_step`, and for window
        decoders with `use_graphs` (None: eager).
        `restart_step_before`: see DiffusionStageConfig."""
        self.model: Any = model
        self.parted = isinstance(model, PartedVelocity)
        self.restart_step_before = restart_step_before
        self.decoder = isinstance(model, WindowDecoder)
        self.crossfade = crossfade
        self.trajectories: dict[int, _Trajectory] = {}
        self.noise: dict[str, NoiseStream] = {}
        self.joiners: dict[str, Joiner] = {}
        self.groups: dict[tuple[str, object], _Group] = {}  # by (solver, model group)
        self.frame_step: int | None = getattr(model, "graph_frame_step", None) if graphs is not None else None
        # a solver's model is graphed in frame buckets; a window decoder graphs its own calls
        graphed_decoder = self.decoder and hasattr(model, "use_graphs")
        self.graphs = graphs if self.frame_step or graphed_decoder else None
        self.graph_batch_sizes = tuple(sorted(graph_batch_sizes))
        self.graph_max_frames = graph_max_frames
        self.owned = isinstance(model, RequestModel)  # the model starts trajectories and shapes outputs
        self._velocity = None if self.decoder else model.velocity
        if self.graphs is not None:
            if not self.decoder:
                self._velocity = self.graphs.wrap(model.velocity, "velocity")
            use_graphs = getattr(model, "use_graphs", None)
            if use_graphs is not None:  # the model graphs its own parts (a vocoder, a decoder's calls)
                use_graphs(self.graphs, self.graph_batch_sizes)

    def warm_up_plan(self, streaming: StreamingConfig, max_batch: int) -> list[tuple[int, int]]:
        """The (rows, frames) buckets a stream's solver steps can use, as many as the graphs
        allow: the buckets of the windows every stream has (first chunk, steady chunks) at
        every batch bucket up to `max_batch`'s first, then every other bucket up to the
        longest window (last chunks are shorter), smallest frames first."""
        if self.graphs is None or self.frame_step is None:
            return []
        rows = buckets_upto(max_batch, self.graph_batch_sizes)
        fpi, step = self.model.frames_per_input, self.frame_step
        windows = streamed_window_lengths(streaming)
        frames = [f for f in dict.fromkeys(round_up(n * fpi, step) for n in windows) if f <= self.graph_max_frames]
        longest = min(round_up(max(windows) * fpi, step), self.graph_max_frames)
        frames += [f for f in range(step, longest + 1, step) if f not in frames]
        return [(r, f) for f in frames for r in rows][: self.graphs.max_graphs]

    @torch.no_grad()
    def warm_up_graphs(self, streaming: StreamingConfig, max_batch: int, params: DiffusionParams) -> GraphWarmup:
        """Capture at start-up the CUDA graphs streamed requests will replay (`warm_up_plan`,
        and what the model graphs of its own: the vocoder at the streamed window lengths), so
        no request's step stalls on a first capture. `params`: a request's resolved defaults
        (its speaker conditions the dummy windows)."""
        t0 = time.monotonic()
        if self.decoder and self.graphs is not None:  # its calls' shapes are the model's to know
            rows = buckets_upto(max_batch, self.graph_batch_sizes)
            return GraphWarmup(self.model.warm_up_graphs(streaming, rows), time.monotonic() - t0)
        shapes = self.warm_up_plan(streaming, max_batch)
        if not shapes:  # no graphs (or a model without graph buckets)
            return GraphWarmup(0, 0.0)
        m, graphed = self.model, 0
        # Largest first: smaller graphs then reuse the shared pool's blocks.
        for rows, frames in sorted(shapes, key=lambda s: s[0] * s[1], reverse=True):
            window = Window("graph-warm-up", torch.zeros(frames // m.frames_per_input, dtype=torch.long), 0, params)
            batch = m.collate([m.condition(window)], torch.tensor([params.guidance_scale]), pad_to=(rows, frames))
            x = torch.zeros(rows, frames, m.state_dim, device=m.device)
            graphed += bool(self._velocity.ready(batch, x, torch.zeros(rows, device=m.device)))  # type: ignore[union-attr]
        warm_model = getattr(m, "warm_up_graphs", None)
        if warm_model is not None:
            rows = sorted({r for r, _ in shapes})
            context = getattr(m, "decode_context", None)  # the decoder's windows are the spans it decodes
            left, right = (None, None) if context is None else (context[0] + self._hold(), context[1])
            lengths = streamed_window_lengths(streaming, left, right)
            graphed += warm_model([n * m.frames_per_input for n in lengths], rows)
        return GraphWarmup(graphed, time.monotonic() - t0)

    def graph_shape(self, rows: int, frames: int) -> tuple[int, int] | None:
        """The bucket a step of `rows` x `frames` is padded to, or None: it runs eagerly."""
        if self.graphs is None or self.frame_step is None:
            return None
        b, f = bucket(rows, self.graph_batch_sizes), round_up(frames, self.frame_step)
        return None if b is None or f > self.graph_max_frames else (b, f)

    def _start(self, spec: TrajectorySpec) -> None:
        w, m = spec.window, self.model
        if self.owned:
            s = m.start(w)  # type: ignore[attr-defined]
            cond = m.condition(w)
            grid = s.grid.float().cpu().tolist()  # fp32 values; each step's times go in one copy
            self.trajectories[spec.traj_id] = _Trajectory(
                w.request_id, spec.plan, cond, s.x, grid, s.guidance, s.solver, s.group, s.preview_every
            )
            return
        assert w.params.seed is not None
        noise = self.noise.setdefault(w.request_id, NoiseStream(w.params.seed, m.state_dim))
        fpi = m.frames_per_input
        x0 = noise.take(w.start * fpi, (w.start + w.ids.numel()) * fpi)
        self.trajectories[spec.traj_id] = _Trajectory(
            request_id=w.request_id,
            plan=spec.plan,
            cond=m.condition(w),
            x=x0.to(m.device),
            grid=time_grid(w.params.num_steps, w.params.sway_coefficient).tolist(),
            guidance=w.params.guidance_scale,
            solver=w.params.solver,
        )

    def _free(self, request_id: str) -> None:
        if self.decoder:
            self.model.release(request_id)
        self.noise.pop(request_id, None)
        self.joiners.pop(request_id, None)
        for tid in [t for t, tr in self.trajectories.items() if tr.request_id == request_id]:
            del self.trajectories[tid]

    def _group(self, key: tuple[int, ...], trajs: list[_Trajectory]) -> _Group:
        m = self.model
        n, s = len(trajs), max(t.x.shape[0] for t in trajs)
        shape = self.graph_shape(n, s)
        rows, frames = shape or (n, s)
        x = torch.zeros(rows, frames, m.state_dim, device=m.device)
        for i, t in enumerate(trajs):
            x[i, : t.x.shape[0]] = t.x
        guidance = torch.tensor([t.guidance for t in trajs], dtype=torch.float32)
        conds = [t.cond for t in trajs]
        batch = m.collate(conds, guidance) if shape is None else m.collate(conds, guidance, pad_to=shape)  # type: ignore[call-arg]
        return _Group(key, batch, x, shape is not None)

    def _times(self, trajs: list[_Trajectory], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's time pair of its next solver step (padded rows: t = 0, their output is
        dropped), on the device in one copy."""
        times = torch.zeros(2, rows, dtype=torch.float32)
        times[:, : len(trajs)] = torch.tensor([[t.grid[t.k] for t in trajs], [t.grid[t.k + 1] for t in trajs]])
        t0, t1 = times.to(self.model.device)
        return t0, t1

    def _step(self, group_key: tuple[str, object], tids: list[int]) -> tuple[int, int, list[int]]:
        """Advance trajectories that share a solver and model group, in one padded batch: a
        whole solver step, or one part of a parted Euler step. Returns the solver steps
        (0 or 1) begun and ended, and the trajectories whose step ended."""
        m, solver, key = self.model, group_key[0], tuple(tids)
        g = self.groups.get(group_key)
        if g is not None and g.step is not None and g.key != key:
            joined = any(tid not in g.key for tid in key)
            if joined and g.step.done <= self.restart_step_before:
                g.step = None  # restarted with the newcomers: the parts run so far are dropped
        if g is None or (g.step is None and g.key != key):
            g = self.groups[group_key] = self._group(key, [self.trajectories[tid] for tid in tids])
        begun = 0
        if g.step is None:
            t0, t1 = self._times([self.trajectories[tid] for tid in g.key], g.x.shape[0])
            if not (self.parted and solver == "euler" and not g.graphed):
                velocity = self._velocity if g.graphed else m.velocity
                batch = g.batch
                g.x = SOLVERS[solver](lambda tt, xx: velocity(batch, xx, tt), t0, t1, g.x)
                return 1, 1, self._advance(g)
            g.step = _PartedStep(m.velocity_parts(g.batch, g.x, t0), t0, t1)
            begun = 1
        step = g.step
        try:
            step.done = next(step.parts)
            return begun, 0, []
        except StopIteration as stop:
            g.x = euler_update(g.x, step.t0, step.t1, stop.value)
            g.step = None
            return begun, 1, self._advance(g)

    def _advance(self, g: _Group) -> list[int]:
        """A solver step of the group ended: its live trajectories take their new state.
        Returns them."""
        stepped = []
        for i, tid in enumerate(g.key):
            t = self.trajectories.get(tid)
            if t is not None:  # not ended while the step was in flight
                t.x = g.x[i, : t.x.shape[0]]
                t.k += 1
                stepped.append(tid)
        return stepped

    def _previews(self, trajs: list[_Trajectory], result: StepResult) -> None:
        due = [t for t in trajs if t.preview_every and t.k % t.preview_every == 0]
        if not due:
            return
        outs = self.model.render([t.cond for t in due], [t.x for t in due])  # type: ignore[attr-defined]
        for t, out in zip(due, outs, strict=True):
            result.outputs[t.request_id] = (Preview(out, t.k), False)  # type: ignore[assignment]

    def _hold(self) -> int:
        """Ids before a chunk whose samples its crossfade with the chunk before reads."""
        return -(-self.crossfade // self.model.samples_per_input)

    def _decode_span(self, plan: ChunkPlan) -> ChunkPlan:
        """What of a solved window the decoder runs on (`decode_span`): the whole window unless
        the model says how far its decoder reaches (`decode_context`, in ids)."""
        context = getattr(self.model, "decode_context", None)
        return plan if context is None else decode_span(plan, context, self._hold())

    def _emit(self, result: StepResult, tid: int, request_id: str, plan: ChunkPlan, out: torch.Tensor) -> None:
        """Join a finished window's output into its request's stream."""
        joiner = self.joiners.setdefault(request_id, Joiner(self.model.samples_per_input, self.crossfade))
        samples = joiner.push(plan, out)
        prev = result.outputs.get(request_id)
        if prev is not None:  # two chunks of one request finished in the same step
            samples = torch.cat([prev[0], samples])
        result.outputs[request_id] = (samples, plan.last)
        result.done.append(tid)

    def _decode(self, plan: StepPlan, result: StepResult) -> StepResult:
        """A WindowDecoder's step: every new window decoded in one batched call."""
        specs, conds = [], []
        for spec in plan.new:
            try:
                conds.append(self.model.condition(spec.window))
                specs.append(spec)
            except Exception as err:  # a bad request must not take the batch down
                log.exception("request %s: cannot decode a window", spec.window.request_id)
                result.errors[spec.window.request_id] = f"{type(err).__name__}: {err}"
        if specs:
            for spec, out in zip(specs, self.model.decode_windows(conds), strict=True):
                self._emit(result, spec.traj_id, spec.window.request_id, spec.plan, out)
        return result

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepResult:
        result = StepResult()
        for rid in plan.freed:
            self._free(rid)
        if self.decoder:
            return self._decode(plan, result)
        for spec in plan.new:
            try:
                self._start(spec)
            except Exception as err:  # a bad request must not take the batch down
                log.exception("request %s: cannot start a trajectory", spec.window.request_id)
                result.errors[spec.window.request_id] = f"{type(err).__name__}: {err}"
        live = [tid for tid in plan.step_ids if tid in self.trajectories]
        by_key: dict[tuple[str, object], list[int]] = {}
        for tid in live:
            tr = self.trajectories[tid]
            by_key.setdefault((tr.solver, tr.group), []).append(tid)
        for key in [k for k in self.groups if k not in by_key]:
            del self.groups[key]  # nothing of it runs now: its padded state is not kept
        stepped: list[int] = []  # trajectories whose solver step ended in this engine step
        for key, tids in by_key.items():
            begun, ended, advanced = self._step(key, tids)
            result.begun += begun
            result.ended += ended
            stepped += advanced
        # In trajectory id order: a request's chunks are planned in order, so chunks of one
        # request that finish in the same step (max_chunks_in_flight > 1) join in order.
        finished = sorted(tid for tid in stepped if self.trajectories[tid].k == len(self.trajectories[tid].grid) - 1)
        if self.owned:
            self._previews([self.trajectories[t] for t in stepped if t not in finished], result)
        if finished:
            done = [self.trajectories[tid] for tid in finished]
            spans = [t.plan for t in done]
            if self.owned:
                outs = self.model.render([t.cond for t in done], [t.x for t in done])  # type: ignore[attr-defined]
            else:
                spans = [self._decode_span(t.plan) for t in done]
                fpi = self.model.frames_per_input
                outs = self.model.decode(
                    [t.x[(s.window_start - t.plan.window_start) * fpi : (s.window_end - t.plan.window_start) * fpi]
                     for t, s in zip(done, spans, strict=True)]
                )  # fmt: skip
            for tid, out, span in zip(finished, outs, spans, strict=True):
                tr = self.trajectories.pop(tid)
                if self.owned:  # one trajectory per request: its output is the request's
                    result.outputs[tr.request_id] = (out, True)
                    result.done.append(tid)
                    continue
                self._emit(result, tid, tr.request_id, span, out)
        return result

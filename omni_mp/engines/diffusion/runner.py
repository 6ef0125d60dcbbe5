"""Worker-side state and execution of the diffusion engine (no vLLM imports; the vLLM worker
class in `vllm_hooks_diffusion` delegates here).

Holds every running trajectory (its state, conditioning and time grid) like an AR worker
holds KV cache, and per request the noise stream and the output joiner. `execute` runs one
solver step over the scheduled trajectories (grouped by solver; rows padded to the longest
state), decodes those that reached t = 1, and joins their output into the request's stream.
A `WindowDecoder` (no solver) has no trajectories: its windows are decoded, batched, in the
step that admits them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from omni_mp.engines.diffusion.batcher import StepPlan, StepResult, TrajectorySpec
from omni_mp.engines.diffusion.chunking import ChunkPlan, Joiner
from omni_mp.engines.diffusion.model import DiffusionModel, WindowDecoder
from omni_mp.engines.diffusion.solver import SOLVERS, time_grid

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
    grid: torch.Tensor  # time points, on the model's device
    guidance: float
    solver: str
    k: int = 0  # solver steps taken


class DiffusionRunner:
    def __init__(self, model: DiffusionModel | WindowDecoder, crossfade: int) -> None:
        self.model: Any = model
        self.decoder = isinstance(model, WindowDecoder)
        self.crossfade = crossfade
        self.trajectories: dict[int, _Trajectory] = {}
        self.noise: dict[str, NoiseStream] = {}
        self.joiners: dict[str, Joiner] = {}

    def _start(self, spec: TrajectorySpec) -> None:
        w, m = spec.window, self.model
        assert w.params.seed is not None
        noise = self.noise.setdefault(w.request_id, NoiseStream(w.params.seed, m.state_dim))
        fpi = m.frames_per_input
        x0 = noise.take(w.start * fpi, (w.start + w.ids.numel()) * fpi)
        self.trajectories[spec.traj_id] = _Trajectory(
            request_id=w.request_id,
            plan=spec.plan,
            cond=m.condition(w),
            x=x0.to(m.device),
            grid=time_grid(w.params.num_steps, w.params.sway_coefficient).to(m.device),
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

    def _step(self, trajs: list[_Trajectory]) -> None:
        """One solver step for trajectories that share a solver, in one padded batch."""
        m = self.model
        n, s = len(trajs), max(t.x.shape[0] for t in trajs)
        x = torch.zeros(n, s, m.state_dim, device=m.device)
        for i, t in enumerate(trajs):
            x[i, : t.x.shape[0]] = t.x
        t0 = torch.stack([t.grid[t.k] for t in trajs])
        t1 = torch.stack([t.grid[t.k + 1] for t in trajs])
        batch = m.collate([t.cond for t in trajs], torch.tensor([t.guidance for t in trajs], device=m.device))
        x = SOLVERS[trajs[0].solver](lambda tt, xx: m.velocity(batch, xx, tt), t0, t1, x)
        for i, t in enumerate(trajs):
            t.x = x[i, : t.x.shape[0]]
            t.k += 1

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
        by_solver: dict[str, list[_Trajectory]] = {}
        for tid in live:
            tr = self.trajectories[tid]
            by_solver.setdefault(tr.solver, []).append(tr)
        for trajs in by_solver.values():
            self._step(trajs)
        finished = [tid for tid in live if self.trajectories[tid].k == len(self.trajectories[tid].grid) - 1]
        if finished:
            outs = self.model.decode([self.trajectories[tid].x for tid in finished])
            for tid, out in zip(finished, outs, strict=True):
                tr = self.trajectories.pop(tid)
                self._emit(result, tid, tr.request_id, tr.plan, out)
        return result

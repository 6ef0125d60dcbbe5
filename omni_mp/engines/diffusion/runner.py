"""Worker-side state and execution of the diffusion engine (no vLLM imports; the vLLM worker
class in `vllm_hooks_diffusion` delegates here).

Holds every running trajectory (its state, conditioning and time grid) like an AR worker
holds KV cache, and per request the noise stream and the output joiner. `execute` runs one
solver step over the scheduled trajectories (grouped by solver; rows padded to the longest
state), decodes those that reached t = 1, and joins their output into the request's stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from omni_mp.engines.diffusion.batcher import StepPlan, StepResult, TrajectorySpec
from omni_mp.engines.diffusion.chunking import ChunkPlan, Joiner
from omni_mp.engines.diffusion.model import DiffusionModel, Preview, RequestModel
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
    group: object = None  # trajectories share a model call only within a group (and solver)
    preview_every: int = 0  # RequestModel trajectories: render a preview after every this many steps
    k: int = 0  # solver steps taken


class DiffusionRunner:
    def __init__(self, model: DiffusionModel, crossfade: int) -> None:
        self.model = model
        self.crossfade = crossfade
        self.trajectories: dict[int, _Trajectory] = {}
        self.noise: dict[str, NoiseStream] = {}
        self.joiners: dict[str, Joiner] = {}
        self.owned = isinstance(model, RequestModel)  # the model starts trajectories and shapes outputs

    def _start(self, spec: TrajectorySpec) -> None:
        w, m = spec.window, self.model
        if self.owned:
            s = m.start(w)  # type: ignore[attr-defined]
            cond = m.condition(w)
            self.trajectories[spec.traj_id] = _Trajectory(
                w.request_id, spec.plan, cond, s.x, s.grid, s.guidance, s.solver, s.group, s.preview_every
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
            grid=time_grid(w.params.num_steps, w.params.sway_coefficient).to(m.device),
            guidance=w.params.guidance_scale,
            solver=w.params.solver,
        )

    def _free(self, request_id: str) -> None:
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

    def _previews(self, trajs: list[_Trajectory], result: StepResult) -> None:
        due = [t for t in trajs if t.preview_every and t.k % t.preview_every == 0]
        if not due:
            return
        outs = self.model.render([t.cond for t in due], [t.x for t in due])  # type: ignore[attr-defined]
        for t, out in zip(due, outs, strict=True):
            result.outputs[t.request_id] = (Preview(out, t.k), False)  # type: ignore[assignment]

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepResult:
        result = StepResult()
        for rid in plan.freed:
            self._free(rid)
        for spec in plan.new:
            try:
                self._start(spec)
            except Exception as err:  # a bad request must not take the batch down
                log.exception("request %s: cannot start a trajectory", spec.window.request_id)
                result.errors[spec.window.request_id] = f"{type(err).__name__}: {err}"
        live = [tid for tid in plan.step_ids if tid in self.trajectories]
        by_solver: dict[tuple[str, object], list[_Trajectory]] = {}
        for tid in live:
            tr = self.trajectories[tid]
            by_solver.setdefault((tr.solver, tr.group), []).append(tr)
        for trajs in by_solver.values():
            self._step(trajs)
        finished = [tid for tid in live if self.trajectories[tid].k == len(self.trajectories[tid].grid) - 1]
        if self.owned:
            self._previews([self.trajectories[t] for t in live if t not in finished], result)
        if finished:
            done = [self.trajectories[tid] for tid in finished]
            if self.owned:
                outs = self.model.render([t.cond for t in done], [t.x for t in done])  # type: ignore[attr-defined]
            else:
                outs = self.model.decode([t.x for t in done])
            for tid, out in zip(finished, outs, strict=True):
                tr = self.trajectories.pop(tid)
                if self.owned:  # one trajectory per request: its output is the request's
                    result.outputs[tr.request_id] = (out, True)
                    result.done.append(tid)
                    continue
                joiner = self.joiners.setdefault(tr.request_id, Joiner(self.model.samples_per_input, self.crossfade))
                samples = joiner.push(tr.plan, out)
                prev = result.outputs.get(tr.request_id)
                if prev is not None:  # two chunks of one request finished in the same step
                    samples = torch.cat([prev[0], samples])
                result.outputs[tr.request_id] = (samples, tr.plan.last)
                result.done.append(tid)
        return result

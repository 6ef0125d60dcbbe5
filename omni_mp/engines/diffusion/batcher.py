"""Scheduler-side policy of the diffusion engine (no vLLM imports; the vLLM scheduler class in
`vllm_hooks_diffusion` delegates here).

A request owns its input ids (growing while upstream streams) and a series of chunks; a
chunk whose ids have arrived becomes a trajectory. Every `schedule()` advances every running
trajectory by one solver step and admits waiting ones into free slots first: requests join
and leave between solver steps. Waiting trajectories are admitted by chunk index, then
arrival: first chunks go first (time to first audio), and a request's chunks start in order,
so they also finish in order (all of a request's chunks take the same number of steps). At
most `streaming.max_chunks_in_flight` chunks of one request run at once (default 1).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

from omni_mp.engines.diffusion.chunking import ChunkPlan, next_chunk, one_shot
from omni_mp.engines.diffusion.model import Window
from omni_mp.engines.diffusion.params import DiffusionParams, StreamingConfig


@dataclass
class DiffusionRequest:
    """What the engine hands to `EngineCore.add_request` (the fields EngineCore reads are the
    last three)."""

    request_id: str
    params: DiffusionParams | Any  # resolved: seed and speaker set (a RequestModel's own params)
    ids: list[int]
    closed: bool  # no more ids will come
    stream: bool  # emit chunk by chunk; else one trajectory over all ids once closed
    inputs: Any = None  # a RequestModel's request inputs (then `ids` is empty)
    arrival: int = 0
    chunks_planned: int = 0
    emitted: int = 0  # ids whose output a planned chunk covers
    context: int = 0  # the first ids are context only: decoded in the first chunk's window, never emitted
    planned_last: bool = False
    pooling_params: None = None
    kv_transfer_params: None = None
    abort_immediately: bool = False


@dataclass(frozen=True, slots=True)
class TrajectorySpec:
    traj_id: int
    window: Window
    plan: ChunkPlan


@dataclass
class StepPlan:
    """One `schedule()` result: what the worker does this step."""

    new: list[TrajectorySpec]
    step_ids: list[int]  # trajectories (new ones included) to advance by one solver step
    freed: list[str]  # requests that ended: drop their worker state
    total_num_scheduled_tokens: int  # EngineCore reads it: > 0 means the model ran


@dataclass
class StepResult:
    """The worker's answer: finished trajectories, joined audio, per-request failures."""

    done: list[int] = field(default_factory=list)
    outputs: dict[str, tuple[torch.Tensor, bool]] = field(default_factory=dict)  # rid -> (samples, last)
    errors: dict[str, str] = field(default_factory=dict)
    begun: int = 0  # solver steps (one per group) begun in this step; a parted one ends in a later step
    ended: int = 0


class Batcher:
    def __init__(self, max_batch: int, streaming: StreamingConfig) -> None:
        self.max_batch = max_batch
        self.streaming = streaming
        self.requests: dict[str, DiffusionRequest] = {}
        self.waiting: list[TrajectorySpec] = []
        self.running: dict[int, str] = {}  # traj id -> request id
        self.freed: list[str] = []
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self.progress = (0, 0)  # solver steps begun and ended by the last step (`StepResult`)

    def add(self, req: DiffusionRequest) -> None:
        req.arrival = next(self._arrivals)
        self.requests[req.request_id] = req

    def extend(self, request_id: str, ids: list[int], closed: bool) -> None:
        req = self.requests[request_id]
        req.ids.extend(ids)
        req.closed = req.closed or closed

    def finish(self, request_ids: list[str]) -> None:
        """End requests (abort or error): their trajectories leave the batch at once."""
        for rid in request_ids:
            if self.requests.pop(rid, None) is None:
                continue
            self.waiting = [t for t in self.waiting if t.window.request_id != rid]
            for tid in [t for t, r in self.running.items() if r == rid]:
                del self.running[tid]
            self.freed.append(rid)

    def runnable(self) -> bool:
        """Would a step do anything now (not only wait for upstream ids)?"""
        if self.running or self.waiting or self.freed:
            return True
        return any(self._plan(req, dry=True) for req in self.requests.values())

    def _plan(self, req: DiffusionRequest, dry: bool = False) -> ChunkPlan | None:
        if req.planned_last:
            return None
        if req.stream:
            plan = next_chunk(self.streaming, req.chunks_planned, req.emitted, len(req.ids), req.closed)
        else:
            plan = one_shot(len(req.ids)) if req.closed else None
        if plan is None or dry:
            return plan
        if req.context and req.chunks_planned == 0:  # the first window decodes the context first
            plan = dataclasses.replace(plan, window_start=0, emit_start=max(plan.emit_start, req.context))
        req.chunks_planned += 1
        req.emitted = plan.emit_end
        req.planned_last = plan.last
        window = Window(
            request_id=req.request_id,
            ids=torch.tensor(req.ids[plan.window_start : plan.window_end], dtype=torch.long),
            start=plan.window_start,
            params=req.params,
            inputs=req.inputs,
        )
        self.waiting.append(TrajectorySpec(next(self._ids), window, plan))
        return plan

    def schedule(self) -> StepPlan:
        for req in self.requests.values():
            while self._plan(req) is not None:
                pass
        self.waiting.sort(key=lambda t: (t.plan.index, self.requests[t.window.request_id].arrival))
        in_flight = collections.Counter(self.running.values())
        new, held = [], []
        for t in self.waiting:
            rid = t.window.request_id
            if len(self.running) < self.max_batch and in_flight[rid] < self.streaming.max_chunks_in_flight:
                self.running[t.traj_id] = rid
                in_flight[rid] += 1
                new.append(t)
            else:
                held.append(t)
        self.waiting = held
        freed, self.freed = self.freed, []
        step_ids = list(self.running)
        return StepPlan(new=new, step_ids=step_ids, freed=freed, total_num_scheduled_tokens=len(step_ids))

    def update(self, result: StepResult) -> list[tuple[str, torch.Tensor | None, bool, str | None]]:
        """Apply the worker's result: (request id, samples or None, finished, error or None) per request."""
        self.progress = (result.begun, result.ended)
        for tid in result.done:
            self.running.pop(tid, None)
        events: list[tuple[str, torch.Tensor | None, bool, str | None]] = []
        for rid, (samples, last) in result.outputs.items():
            if rid not in self.requests:  # ended while the step ran
                continue
            events.append((rid, samples, last, None))
            if last:
                del self.requests[rid]
                self.freed.append(rid)
        for rid, message in result.errors.items():
            if rid in self.requests:
                self.finish([rid])
                events.append((rid, None, True, message))
        return events

    def num_unfinished(self) -> int:
        return len(self.requests)

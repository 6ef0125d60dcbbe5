"""Which stage links are open. Every replica of a stage links to every replica of its
downstream stages (`replicas:`); a link counts once the upstream replica acknowledged it
(`Connected`) for the downstream replica's current run.

The state is the replicas' own (`StageHandle.run`): a run records which run of each downstream
replica it acknowledged a link to. A replica that dies or comes back is a new run, so its own
acknowledgements start empty and an upstream replica's acknowledgement of an earlier run does
not count, even if the new run reported the very same address; an acknowledgement counts only
when it names the address of the downstream replica's current run.
"""

from __future__ import annotations

from collections.abc import Mapping

from omni_mp.config.schema import PipelineConfig
from omni_mp.control.router import ReplicaKey
from omni_mp.control.stage_handle import StageHandle
from omni_mp.wire.messages import Connect, StageEndpoint


class Wiring:
    def __init__(self, cfg: PipelineConfig, stages: Mapping[ReplicaKey, StageHandle]) -> None:
        self.cfg = cfg
        self.stages = stages
        self._replicas = {s.id: [ReplicaKey(s.id, r) for r in range(s.replicas)] for s in cfg.stages}
        self._down = {s.id: cfg.downstream(s.id) for s in cfg.stages}

    def replicas(self, stage_id: int) -> list[ReplicaKey]:
        return self._replicas[stage_id]

    def _endpoint(self, key: ReplicaKey) -> StageEndpoint | None:
        run = self.stages[key].run
        if run is None or run.endpoint is None:
            return None
        return StageEndpoint(stage_id=key.stage_id, endpoint=run.endpoint, replica=key.replica)

    def on_ready(self, key: ReplicaKey) -> list[tuple[ReplicaKey, Connect]]:
        """Replica `key` has a new ready run: the Connects to send (to it, for its links to
        every ready downstream replica, and to every ready upstream replica, for its link to
        this one, whose address is new; their other links stay as they are)."""
        out = []
        own = [e for d in self._down[key.stage_id] for k in self._replicas[d] if (e := self._endpoint(k)) is not None]
        if own:
            out.append((key, Connect(downstream=own)))
        me = self._endpoint(key)
        assert me is not None
        for u in self.cfg.stage(key.stage_id).inputs:
            for up in self._replicas[u]:
                if self.stages[up].ready:
                    out.append((up, Connect(downstream=[me])))
        return out

    def on_connected(self, key: ReplicaKey, downstream: list[StageEndpoint]) -> None:
        h = self.stages.get(key)
        if h is None or not h.ready:
            return  # from a run that is gone
        for d in downstream:
            target_key = ReplicaKey(d.stage_id, d.replica)
            target = self.stages.get(target_key)
            run = None if target is None else target.run
            if run is not None and run.ready and run.endpoint == d.endpoint:
                h.linked(target_key, run)

    def linked(self, up: ReplicaKey, down: ReplicaKey) -> bool:
        """`up`'s current run acknowledged its link to `down`'s current, ready run."""
        run, target = self.stages[up].run, self.stages[down].run
        return run is not None and target is not None and target.ready and run.links.get(down) is target

    def serving(self, key: ReplicaKey) -> bool:
        """Ready and linked to a ready replica of each downstream stage: it can take requests."""
        run = self.stages[key].run
        if run is None or not run.ready:
            return False
        return all(any(self.linked(key, k) for k in self._replicas[d]) for d in self._down[key.stage_id])

    def wired(self, key: ReplicaKey) -> bool:
        """Ready and linked to every replica of each downstream stage (all ready)."""
        run = self.stages[key].run
        if run is None or not run.ready:
            return False
        return all(self.linked(key, k) for d in self._down[key.stage_id] for k in self._replicas[d])

    def not_wired(self) -> list[ReplicaKey]:
        return [k for k in self.stages if not self.wired(k)]

    def stages_down(self) -> list[int]:
        """Stages with no serving replica: while there is one, no request can be served."""
        return [sid for sid, keys in self._replicas.items() if not any(self.serving(k) for k in keys)]

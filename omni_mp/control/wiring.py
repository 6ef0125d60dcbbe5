"""Which stage links are open: a stage serves once it is ready and its links to the current
incarnation of every downstream stage are acknowledged (`Connected`).

A stage that dies or comes back is a new incarnation: every link to it is forgotten, so an
upstream stage counts as wired again only after it acknowledged a `Connect` naming the new
address (each incarnation binds a fresh ipc name, and tcp a fresh port, so an old
acknowledgement cannot match the new address).
"""

from __future__ import annotations

from omni_mp.config import PipelineConfig
from omni_mp.wire.messages import Connect, StageEndpoint


class Wiring:
    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.bound: dict[int, str] = {}  # ready stages -> the input address they reported
        self.connected: dict[int, dict[int, str]] = {s.id: {} for s in cfg.stages}

    def _forget(self, stage_id: int) -> None:
        self.connected[stage_id] = {}
        for up in self.cfg.stage(stage_id).inputs:
            self.connected[up].pop(stage_id, None)

    def on_ready(self, stage_id: int, endpoint: str) -> list[tuple[int, Connect]]:
        """A new incarnation is ready at `endpoint`: the Connects to send (to it, for its
        downstream links, and to its upstream stages, for their links to it)."""
        self._forget(stage_id)
        self.bound[stage_id] = endpoint
        out = []
        for sid in (stage_id, *self.cfg.stage(stage_id).inputs):
            downstream = [
                StageEndpoint(stage_id=d, endpoint=self.bound[d]) for d in self.cfg.downstream(sid) if d in self.bound
            ]
            if downstream and sid in self.bound:
                out.append((sid, Connect(downstream=downstream)))
        return out

    def on_connected(self, stage_id: int, downstream: list[StageEndpoint]) -> None:
        if stage_id not in self.bound:
            return  # from an incarnation that is gone
        for d in downstream:
            if d.stage_id in self.connected and self.bound.get(d.stage_id) == d.endpoint:
                self.connected[stage_id][d.stage_id] = d.endpoint

    def on_down(self, stage_id: int) -> None:
        self.bound.pop(stage_id, None)
        self._forget(stage_id)

    def wired(self, stage_id: int) -> bool:
        if stage_id not in self.bound:
            return False
        links = self.connected[stage_id]
        return all(d in self.bound and links.get(d) == self.bound[d] for d in self.cfg.downstream(stage_id))

    def not_wired(self) -> list[int]:
        return [s.id for s in self.cfg.stages if not self.wired(s.id)]

"""Which stage links are open: a stage serves once it is ready and its links to the current
incarnation of every downstream stage are acknowledged (`Connected`).

The state is the stages' own (`StageHandle.run`): a run records which run of each downstream
stage it acknowledged a link to. A stage that dies or comes back is a new run, so its own
acknowledgements start empty and an upstream stage's acknowledgement of an earlier run does
not count, even if the new run reported the very same address; an acknowledgement counts only
when it names the address of the downstream stage's current run.
"""

from __future__ import annotations

from collections.abc import Mapping

from omni_mp.config.schema import PipelineConfig
from omni_mp.control.stage_handle import StageHandle
from omni_mp.wire.messages import Connect, StageEndpoint


class Wiring:
    def __init__(self, cfg: PipelineConfig, stages: Mapping[int, StageHandle]) -> None:
        self.cfg = cfg
        self.stages = stages

    def on_ready(self, stage_id: int) -> list[tuple[int, Connect]]:
        """Stage `stage_id` has a new ready run: the Connects to send (to it, for its
        downstream links, and to its upstream stages, for their links to it)."""
        out = []
        for sid in (stage_id, *self.cfg.stage(stage_id).inputs):
            if not self.stages[sid].ready:
                continue
            downstream = [
                StageEndpoint(stage_id=d, endpoint=run.endpoint)
                for d in self.cfg.downstream(sid)
                if (run := self.stages[d].run) is not None and run.endpoint is not None
            ]
            if downstream:
                out.append((sid, Connect(downstream=downstream)))
        return out

    def on_connected(self, stage_id: int, downstream: list[StageEndpoint]) -> None:
        h = self.stages.get(stage_id)
        if h is None or not h.ready:
            return  # from a run that is gone
        for d in downstream:
            target = self.stages.get(d.stage_id)
            run = None if target is None else target.run
            if run is not None and run.ready and run.endpoint == d.endpoint:
                h.linked(d.stage_id, run)

    def wired(self, stage_id: int) -> bool:
        run = self.stages[stage_id].run
        if run is None or not run.ready:
            return False
        return all(
            (current := self.stages[d].run) is not None and run.links.get(d) is current
            for d in self.cfg.downstream(stage_id)
        )

    def not_wired(self) -> list[int]:
        return [s.id for s in self.cfg.stages if not self.wired(s.id)]

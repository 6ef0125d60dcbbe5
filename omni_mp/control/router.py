"""Which replica of each stage serves a request (`replicas:` in the YAML): chosen once, at
admission; the request's registration, its upstream's rows and chunks, and its abort then go
to that replica only.

The rule, stage by stage from the entry stages down: among the replicas that can take it
(serving: engine up and linked to a serving replica of each downstream stage; linked from
the replicas already chosen upstream; their queue in the coordinator not full), the one with
the fewest requests outstanding (bound to it and not yet done there, counted by the
coordinator the moment it binds or hears `StageDone`, so a burst of admissions between two
heartbeats spreads at once), then the fewest running + waiting in its latest heartbeat (the
stage's own count), then round robin from the replica after the last one chosen. A replica
that is down, restarting or not yet linked is never chosen; a stage with none left refuses
the request (`stage_unavailable`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from omni_mp.config.schema import PipelineConfig, StageConfig


class ReplicaKey(NamedTuple):
    """One stage process: a stage and which of its replicas."""

    stage_id: int
    replica: int


class NoReplica(Exception):
    """A stage has no replica that can take the request; the message says which."""


def topological(cfg: PipelineConfig) -> list[StageConfig]:
    """The stages, each after its inputs (the config is checked acyclic)."""
    done: set[int] = set()
    out: list[StageConfig] = []
    todo = list(cfg.stages)
    while todo:
        ready = [s for s in todo if all(u in done for u in s.inputs)]
        for s in ready:
            done.add(s.id)
            out.append(s)
        todo = [s for s in todo if s.id not in done]
    return out


class Router:
    def __init__(
        self,
        cfg: PipelineConfig,
        usable: Callable[[ReplicaKey], bool],
        linked: Callable[[ReplicaKey, ReplicaKey], bool],
        load: Callable[[ReplicaKey], int],
    ) -> None:
        """`usable`: the replica can take a request now; `linked(up, down)`: the upstream
        replica's link to the downstream one is open; `load`: running + waiting in its latest
        heartbeat."""
        self.stages = topological(cfg)
        self.usable, self.linked, self.load = usable, linked, load
        self.outstanding: dict[ReplicaKey, int] = {}
        self._next: dict[int, int] = {s.id: 0 for s in cfg.stages}  # round-robin start per stage

    def bind(self) -> dict[int, int]:
        """Stage id -> the replica a new request is bound to (counted as outstanding there
        until `release`); NoReplica if some stage has none that can take it."""
        route: dict[int, int] = {}
        for s in self.stages:
            ups = [ReplicaKey(u, route[u]) for u in s.inputs]
            best: tuple[tuple[int, int], int] | None = None
            start = self._next[s.id]
            for i in range(s.replicas):
                r = (start + i) % s.replicas
                key = ReplicaKey(s.id, r)
                if not self.usable(key) or not all(self.linked(u, key) for u in ups):
                    continue
                score = (self.outstanding.get(key, 0), self.load(key))
                if best is None or score < best[0]:
                    best = (score, r)
            if best is None:
                up = f" linked from replicas {ups}" if ups else ""
                raise NoReplica(
                    f"stage {s.id}: none of its {s.replicas} replica(s) is serving{up} (restarting or failed)"
                )
            route[s.id] = best[1]
            self._next[s.id] = (best[1] + 1) % s.replicas
        for sid, r in route.items():
            key = ReplicaKey(sid, r)
            self.outstanding[key] = self.outstanding.get(key, 0) + 1
        return route

    def release(self, key: ReplicaKey) -> None:
        """A request bound to `key` is done there (or ended)."""
        n = self.outstanding.get(key, 0)
        if n <= 1:
            self.outstanding.pop(key, None)
        else:
            self.outstanding[key] = n - 1

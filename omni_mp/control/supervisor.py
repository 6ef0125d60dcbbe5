"""Stage process supervision: notice deaths and hangs, kill the hung, restart with back-off.
Each replica of a stage is watched, restarted and budgeted on its own (`restart` per replica).

A stage is hung when it is alive but silent: no heartbeat for `heartbeat_timeout_s` (once it
is ready, or once it has sent one: a stage may beat while its engine starts), not ready
`stage_startup_s` after it was (re)started (a restart that hangs in engine start-up is caught
too), or not reading its input while the coordinator's messages to it pile up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from omni_mp.config.schema import PipelineConfig
from omni_mp.control.router import ReplicaKey
from omni_mp.control.stage_handle import Incarnation, StageHandle
from omni_mp.wire.messages import StageStats

log = logging.getLogger("omni_mp.control.supervisor")

MAX_DOUBLINGS = 6  # the back-off doubles per restart up to 2**6 = 64 x `backoff_s`


class Supervisor:
    def __init__(
        self, cfg: PipelineConfig, handles: dict[ReplicaKey, StageHandle], progress: Callable[[str], None]
    ) -> None:
        self.cfg = cfg
        self.handles = handles
        self.progress = progress

    def heartbeat(self, key: ReplicaKey, now: float, stats: StageStats | None = None) -> None:
        h = self.handles.get(key)
        if h is not None:
            h.heartbeat(now, stats)

    def _hang(self, run: Incarnation, now: float, stalled: bool) -> str | None:
        t = self.cfg.timeouts
        if (run.ready or run.beating) and now - run.last_heartbeat > t.heartbeat_timeout_s:
            return f"no heartbeat for {now - run.last_heartbeat:.1f}s"
        if not run.ready and now - run.spawned_at > t.stage_startup_s:
            return f"not ready {t.stage_startup_s:.0f}s after it started"
        if stalled:
            return "not reading its input"
        return None

    def check(self, now: float, stalled: set[ReplicaKey]) -> list[tuple[ReplicaKey, str]]:
        """Respawn replicas whose back-off is over; kill hung ones; return (replica, reason) for
        each one found dead since the last check."""
        deaths = []
        for key, h in self.handles.items():
            if h.restart_at is not None:
                if now >= h.restart_at:
                    h.restart()
                    self.progress(f"{h.name}: restarting (restart {h.restarts}), pid {h.pid}")
                continue
            if h.run is None:
                continue  # failed for good
            code = h.exit_code()
            why = ""
            if code is None:
                hang = self._hang(h.run, now, key in stalled)
                if hang is None:
                    continue
                log.error("%s (pid %s): %s; killing it", h.name, h.pid, hang)
                h.kill()
                code = h.exit_code()
                why = f" after it hung ({hang})"
            deaths.append((key, self._on_death(h, code, why, now)))
        return deaths

    def _on_death(self, h: StageHandle, code: int | None, why: str, now: float) -> str:
        tail = h.last_log_lines(5).strip().splitlines()
        how = "was killed" if code is None else f"died with exit code {code}"  # (None: still exiting)
        reason = f"{h.name} (pid {h.pid}) {how}{why}" + (f"; last log line: {tail[-1]}" if tail else "")
        log.error("%s", reason)
        policy = h.stage.restart
        if h.restarts < policy.max_restarts or policy.when_spent == "retry":
            h.died(restart_at=now + policy.backoff_s * (2 ** min(h.restarts, MAX_DOUBLINGS)))
        else:
            h.died(restart_at=None, reason=reason)
            self.progress(f"{h.name}: died and will not be restarted (max_restarts {policy.max_restarts})")
        return reason

    def down_for_good(self) -> dict[int, str]:
        """Stages whose every replica died with its restart budget spent (`when_spent: stop`),
        and why (the last replica's): while there is one, no request can be served."""
        failed: dict[int, list[str]] = {}
        count: dict[int, int] = {}
        for key, h in self.handles.items():
            count[key.stage_id] = count.get(key.stage_id, 0) + 1
            if h.failure is not None:
                failed.setdefault(key.stage_id, []).append(h.failure)
        return {sid: "; ".join(why) for sid, why in failed.items() if len(why) == count[sid]}

"""Each concurrency level's warm-up: before a level is measured, one unmeasured round at that
level runs the shapes it will run (its batch sizes, its CUDA graphs, allocator growth), so no
first-use cost is counted as a measurement. (A warm-up at the highest level only left the
lower levels' first uses in their numbers: a 2-GPU run's 1-request level took 575 ms to the
thinker's first token, 13 ms in the run before.)

`Warmups` records when each level's warm-up and its measured rounds ran (wall clock,
`time.time()`, the clock of the stage timelines) for the report's line and the JSON, where a
test checks that every level was warmed before it was measured (`order_problems`)."""

from __future__ import annotations

import time
from typing import Any

# What the omni-family runners do per level (the `how` of their records)
ONE_ROUND = "one unmeasured round at each level's concurrency, just before that level's measured rounds"


def warmup_seed(level: int) -> int:
    """The prompt seed of level `level`'s warm-up round: apart from every measured round's
    (1000 x level + round) and the closed loops' (5000 x level), the same on every system."""
    return 1_000_000 + level


class Warmups:
    """When each level's warm-up and measured rounds ran. Levels are named by strings (a
    concurrency, or e.g. "512x512/20 c=4")."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.levels: dict[str, dict[str, Any]] = {}

    def warmed(self, level: object, t0: float, requests: int, **extra: Any) -> None:
        """Level `level` was warmed up from `t0` until now (time.time()) by `requests` requests."""
        t1 = time.time()
        self.levels[str(level)] = {"requests": requests, "wall_s": t1 - t0, "window": [t0, t1], **extra}

    def measured(self, level: object, t0: float) -> None:
        """Level `level`'s measured rounds ran from `t0` until now (after its warm-up, if any)."""
        entry = self.levels.setdefault(str(level), {"requests": 0})
        start = entry.get("measured", [t0])[0]
        entry["measured"] = [start, time.time()]

    def to_json(self) -> dict[str, Any]:
        return {"how": self.how, "levels": self.levels}


def warmup_line(doc: dict[str, Any] | None, label: str = "") -> str | None:
    """The report's line of a `Warmups.to_json()` (None where there is none)."""
    if not doc or "levels" not in doc:
        return None
    levels = "; ".join(
        f"{name}: {lv['requests']} request{'s' if lv['requests'] != 1 else ''}, {lv['wall_s']:.1f} s"
        if lv.get("requests")
        else f"{name}: none"
        for name, lv in doc["levels"].items()
    )
    problems = order_problems(doc)
    note = f"; NOT WARMED FIRST: {'; '.join(problems)}" if problems else ""
    return f"warm-up{f' ({label})' if label else ''}: {doc['how']} ({levels}){note}"


def order_problems(doc: dict[str, Any]) -> list[str]:
    """What is wrong with a record's order: a level measured without a warm-up of its own, or
    before its warm-up ended. Empty: every level was warmed, then measured."""
    out = []
    for name, lv in doc.get("levels", {}).items():
        if "measured" not in lv:
            continue
        if not lv.get("requests") or "window" not in lv:
            out.append(f"{name} had no warm-up")
        elif lv["window"][1] > lv["measured"][0]:
            out.append(f"{name} was measured before its warm-up ended")
    return out

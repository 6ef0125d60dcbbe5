"""The stages' step timelines (omni_mp.stage.timeline: each stage process writes one record per
engine step to OMNI_MP_PROFILE_DIR) as the benchmarks read them: per concurrency level (steps,
step time, how busy each stage was), the thinker -> talker transport per step, and one
request's (or one burst's) path through three stages."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

Timelines = dict[int, list[dict[str, Any]] | str]  # stage id -> its step records, or why there are none


def read_timelines(profile_dir: Path, since: float) -> Timelines:
    """Every stage's step records from `since` on, each timeline file read once for all the
    summaries below."""
    return {sid: stage_timeline(profile_dir, sid, since) for sid in (0, 1, 2)}


def stage_timeline(profile_dir: Path, stage_id: int, since: float = float("-inf")) -> list[dict[str, Any]] | str:
    """Stage `stage_id`'s step records (dicts of omni_mp.stage.timeline.StepRecord's fields)
    that started at `since` or later (time.time()), or why there are none."""
    files = sorted(profile_dir.glob(f"stage{stage_id}-*.json"))
    if not files:
        return f"no stage {stage_id} timeline in {profile_dir}"
    doc = json.loads(files[-1].read_text())
    fields = doc["fields"]
    return [dict(zip(fields, s, strict=True)) for s in doc["steps"] if s[fields.index("t")] >= since]


def stage_step_summary(timelines: Timelines, windows: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """Per concurrency level (its last round) and stage: engine steps, step time p50/mean, how
    busy the engine thread was (sum of step times / round wall time) and its idle waits: the
    slowest stage is the one busy all the time."""
    out: dict[str, Any] = {}
    for c, (t0, t1) in windows.items():
        level: dict[str, Any] = {}
        for sid, all_recs in timelines.items():
            if isinstance(all_recs, str):
                continue
            recs = [r for r in all_recs if t0 <= r["t"] <= t1]
            if not recs:
                continue
            level[str(sid)] = {
                "steps": len(recs),
                "step_ms_p50": statistics.median(r["step_ms"] for r in recs),
                "step_ms_mean": statistics.fmean(r["step_ms"] for r in recs),
                "busy": sum(r["step_ms"] + r["build_ms"] for r in recs) / 1000 / max(t1 - t0, 1e-9),
                "wait_ms_sum": sum(r["wait_ms"] for r in recs),
                "reqs_per_step_mean": statistics.fmean(r["reqs"] for r in recs),
            }
        out[str(c)] = level
    return out


def transport_summary(timelines: Timelines, since: float) -> dict[str, Any]:
    """Thinker -> talker per engine step, in the last round (the highest concurrency), from the
    stage timelines (omni_mp.stage.timeline): on the thinker, the steps that emitted hidden-state
    rows: build (engine thread, outputs -> messages) and send (output thread, encode + send) and
    their wire bytes; on the talker, the steps that took step-embedding rows: receive + decode
    (input thread) and handling (engine thread: the processor's rows into the engine)."""
    out: dict[str, Any] = {}
    thinker = timelines[0]
    if isinstance(thinker, str):
        out["error"] = thinker
    else:
        steps = [r for r in thinker if r["rows"] > 0 and r["t"] >= since]
        if steps:
            out["thinker"] = {
                "steps": len(steps),
                "build_send_us_p50": 1000 * statistics.median(r["build_ms"] + r["send_ms"] for r in steps),
                "build_us_p50": 1000 * statistics.median(r["build_ms"] for r in steps),
                "send_us_p50": 1000 * statistics.median(r["send_ms"] for r in steps),
                # CPU time of the same (the wall times include waits for the GIL); older
                # timelines lack it.
                "build_send_cpu_us_p50": 1000
                * statistics.median(r.get("build_cpu_ms", 0.0) + r.get("send_cpu_ms", 0.0) for r in steps),
                "build_cpu_us_p50": 1000 * statistics.median(r.get("build_cpu_ms", 0.0) for r in steps),
                "send_cpu_us_p50": 1000 * statistics.median(r.get("send_cpu_ms", 0.0) for r in steps),
                "wire_bytes_p50": statistics.median(r["wire_bytes"] for r in steps),
                "rows_per_step_mean": statistics.fmean(r["rows"] for r in steps),
                "reqs_per_step_mean": statistics.fmean(r["reqs"] for r in steps),
                "step_ms_p50": statistics.median(r["step_ms"] for r in steps),
            }
        else:
            out["error"] = "no thinker steps with hidden-state rows"
    talker = timelines[1]
    if isinstance(talker, str):
        out["talker_error"] = talker
    else:
        steps = [r for r in talker if r["rows"] > 0 and r["t"] >= since]
        if steps and "recv_ms" in steps[0]:
            out["talker"] = {
                "steps": len(steps),
                "recv_handle_us_p50": 1000 * statistics.median(r["recv_ms"] + r["handle_ms"] for r in steps),
                "recv_us_p50": 1000 * statistics.median(r["recv_ms"] for r in steps),
                "handle_us_p50": 1000 * statistics.median(r["handle_ms"] for r in steps),
                "rows_per_step_mean": statistics.fmean(r["rows"] for r in steps),
                "step_ms_p50": statistics.median(r["step_ms"] for r in steps),
            }
        else:
            out["talker_error"] = "no talker steps with receive times (rows taken)"
    return out


def stage_steps_table(title: str, steps: dict[str, dict[str, Any]], names: tuple[str, ...]) -> list[str]:
    """Markdown lines of `stage_step_summary`'s levels: per stage (named in stage-id order) its
    steps, step p50 / mean and busy share."""
    lines = [title, "| concurrency | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for c, level in steps.items():
        cells = [
            f"{v['steps']} steps, {v['step_ms_p50']:.1f} / {v['step_ms_mean']:.1f} ms, busy {100 * v['busy']:.0f}%"
            if (v := level.get(str(sid)))
            else "-"
            for sid in range(len(names))
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def in_window(timelines: Timelines, window: tuple[float, float]) -> dict[int, list[dict[str, Any]]] | str:
    """Each stage's step records within `window`, or why a stage has none."""
    t0, t1 = window
    out = {}
    for sid in (0, 1, 2):
        recs = timelines[sid]
        if isinstance(recs, str):
            return recs
        out[sid] = [r for r in recs if t0 <= r["t"] <= t1]
    return out


def step_end_ms(r: dict[str, Any], t0: float) -> float:
    """When a step record's step ended, in ms from `t0`."""
    return (r["t"] - t0) * 1000 + r["step_ms"]


def critical_path(timelines: Timelines, window: tuple[float, float], first_codes: int) -> dict[str, Any]:
    """One request alone (the last round at concurrency 1), from the stage timelines: when each
    stage did its part, in ms from the round's start. At one request each talker step with
    output wrote one code, so the talker's `first_codes`-th output step is when token2wav could
    start the first chunk; what follows the thinker's last token (the talker alone, then the
    last chunk) is the tail the thinker's pace does not set."""
    t0 = window[0]
    stages = in_window(timelines, window)
    if isinstance(stages, str):
        return {"error": stages}
    thinker = [r for r in stages[0] if r["reqs"] > 0]
    talker = [r for r in stages[1] if r["reqs"] > 0]
    t2w = [r for r in stages[2] if r["step_ms"] > 0]
    t2w_out = [r for r in t2w if r["reqs"] > 0]
    if not thinker or len(talker) < first_codes or not t2w_out:
        counts = f"{len(thinker)} thinker, {len(talker)} talker, {len(t2w)} token2wav steps"
        return {"error": f"incomplete timelines ({counts})"}

    thinker_end = thinker[-1]["t"] + thinker[-1]["step_ms"] / 1000
    talker_end = talker[-1]["t"] + talker[-1]["step_ms"] / 1000
    talker_tail = [r for r in stages[1] if r["t"] >= thinker_end]
    t2w_before_first = [r for r in t2w if r["t"] <= t2w_out[0]["t"] and r["t"] >= talker[first_codes - 1]["t"]]
    t2w_tail = [r for r in t2w if r["t"] >= talker_end]
    return {
        "thinker_first_token_ms": step_end_ms(thinker[0], t0),
        "thinker_last_token_ms": step_end_ms(thinker[-1], t0),
        "thinker_steps": len(thinker),
        "thinker_step_ms_mean": statistics.fmean(r["step_ms"] for r in thinker[1:] or thinker),
        "talker_first_code_ms": step_end_ms(talker[0], t0),
        "talker_first_chunk_codes": first_codes,
        "talker_first_chunk_ms": step_end_ms(talker[first_codes - 1], t0),
        "talker_tail_steps": len(talker_tail),
        "talker_tail_step_ms_mean": statistics.fmean(r["step_ms"] for r in talker_tail) if talker_tail else 0.0,
        "talker_last_code_ms": step_end_ms(talker[-1], t0),
        "t2w_first_chunk_steps": len(t2w_before_first),
        "t2w_first_chunk_step_ms_sum": sum(r["step_ms"] for r in t2w_before_first),
        "t2w_first_out_ms": step_end_ms(t2w_out[0], t0),
        "t2w_tail_steps": len(t2w_tail),
        "t2w_tail_step_ms_sum": sum(r["step_ms"] for r in t2w_tail),
        "t2w_last_out_ms": step_end_ms(t2w_out[-1], t0),
    }


def critical_path_line(cp: dict[str, Any]) -> str:
    """`critical_path` as one report line."""
    if "error" in cp:
        return f"\none request's path through the stages: not measured ({cp['error']})"
    return (
        "\none request's path through the stages (c=1, last round; ms from the round's start): "
        f"thinker first token {cp['thinker_first_token_ms']:.0f}, last {cp['thinker_last_token_ms']:.0f} "
        f"({cp['thinker_steps']} steps, {cp['thinker_step_ms_mean']:.2f} ms each after the first); "
        f"talker first code {cp['talker_first_code_ms']:.0f}, code {cp['talker_first_chunk_codes']} (first chunk's "
        f"last) {cp['talker_first_chunk_ms']:.0f}, last {cp['talker_last_code_ms']:.0f} "
        f"({cp['talker_tail_steps']} steps after the thinker's last token, {cp['talker_tail_step_ms_mean']:.2f} ms "
        f"each); token2wav first chunk out {cp['t2w_first_out_ms']:.0f} ({cp['t2w_first_chunk_steps']} steps, "
        f"{cp['t2w_first_chunk_step_ms_sum']:.0f} ms), last chunk out {cp['t2w_last_out_ms']:.0f} "
        f"({cp['t2w_tail_steps']} steps after the talker's last code, {cp['t2w_tail_step_ms_sum']:.0f} ms)"
    )


def burst_path(timelines: Timelines, window: tuple[float, float], c: int, first_codes: int) -> dict[str, Any]:
    """The last round at concurrency `c` (all requests sent at once), from the stage timelines:
    when every request had its thinker token, when the talker first stepped over all of them
    (its widest step: a request whose thinker row is late sits a step out), when it had written
    `c x first_codes` codes (each step writes one code per request it outputs: then the average
    request has the codes its first chunk waits for), and when half of the requests had their
    first audio (the p50: token2wav's first (c + 1) // 2 outputs, first chunks since those go
    first), in ms from the round's start; plus the host time the talker's engine thread spent
    handling input before its first step over all requests."""
    t0 = window[0]
    st = in_window(timelines, window)
    if isinstance(st, str):
        return {"error": st}

    def reached(recs: list[dict[str, Any]], total: int) -> dict[str, Any] | None:
        """The step whose outputs bring the running count of request outputs to `total`."""
        n = 0
        for r in recs:
            n += r["reqs"]
            if n >= total:
                return r
        return None

    thinker_all = next((r for r in st[0] if r["reqs"] >= c), None)
    widest = max((r["reqs"] for r in st[1]), default=0)
    talker_all = next((r for r in st[1] if r["reqs"] >= widest), None) if widest else None
    first_chunk = reached(st[1], c * first_codes)
    half = reached(st[2], (c + 1) // 2)
    if thinker_all is None or talker_all is None or first_chunk is None or half is None:
        return {
            "error": f"incomplete timelines ({len(st[0])} thinker, {len(st[1])} talker, {len(st[2])} token2wav steps)"
        }
    before = [r for r in st[1] if r["t"] <= talker_all["t"]]
    coding = [r for r in st[1] if talker_all["t"] <= r["t"] <= first_chunk["t"]]
    t2w = [r for r in st[2] if first_chunk["t"] <= r["t"] <= half["t"] and r["step_ms"] > 0]
    return {
        "thinker_first_step_ms": step_end_ms(st[0][0], t0),
        "thinker_all_first_token_ms": step_end_ms(thinker_all, t0),
        "thinker_steps_before": sum(1 for r in st[0] if r["t"] < thinker_all["t"]),
        "talker_first_step_all_ms": step_end_ms(talker_all, t0),
        "talker_widest_step": widest,
        "talker_handle_before_ms": sum(r["handle_ms"] for r in before),
        "talker_steps_before": len(before) - 1,
        "talker_step_ms_before": sum(r["step_ms"] for r in before[:-1]),
        "talker_first_chunk_ms": step_end_ms(first_chunk, t0),
        "talker_step_ms_mean": statistics.fmean(r["step_ms"] for r in coding),
        "t2w_steps": len(t2w),
        "t2w_step_ms_sum": sum(r["step_ms"] for r in t2w),
        "t2w_half_out_ms": step_end_ms(half, t0),
    }


def burst_path_line(c: str, bp: dict[str, Any]) -> str:
    """`burst_path` as one report line."""
    if "error" in bp:
        return f"- c={c}: not measured ({bp['error']})"
    return (
        f"- c={c}: thinker first step ends {bp['thinker_first_step_ms']:.0f}, every request's first token "
        f"{bp['thinker_all_first_token_ms']:.0f} ({bp['thinker_steps_before']} steps before); talker's first step "
        f"over all {bp['talker_first_step_all_ms']:.0f} ({bp['talker_widest_step']} requests; before it: "
        f"{bp['talker_steps_before']} steps, {bp['talker_step_ms_before']:.0f} ms, input handling "
        f"{bp['talker_handle_before_ms']:.0f} ms), the first chunk's codes for all {bp['talker_first_chunk_ms']:.0f} "
        f"({bp['talker_step_ms_mean']:.1f} ms a step); "
        f"half with first audio {bp['t2w_half_out_ms']:.0f} ({bp['t2w_steps']} token2wav steps, "
        f"{bp['t2w_step_ms_sum']:.0f} ms)"
    )

"""vllm-omni's result files (written by benchmarks.peer_vllm_omni: `vllm_omni_[qwen3_omni_]<config>
[.<part>].json`) read back and shown beside omni_mp's levels in the reports of
benchmarks.omni_gpu and benchmarks.qwen3_omni_gpu."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common.warmup import warmup_line


def peer_docs(out: Path, family: str = "qwen2_5_omni") -> dict[str, dict[str, Any]]:
    """Every vllm_omni_*<config>[.<part>].json of `family` in `out`, the parts of one config
    merged (levels measured in separate device calls: a later part's level wins; every error is
    kept). Files without a "family" are Qwen2.5-Omni's (written before Qwen3-Omni was added)."""
    merged: dict[str, dict[str, Any]] = {}
    for f in sorted(out.glob("vllm_omni_*.json")):
        doc = json.loads(f.read_text())
        if doc.get("family", "qwen2_5_omni") != family:
            continue
        m = merged.setdefault(doc.get("config", f.stem), {"run_errors": [], "errors": {}, "cold_start_s": []})
        m.update({k: v for k, v in doc.items() if k in ("system", "config", "overlay", "device", "lengths")})
        for c, level in doc.items():
            if c.isdigit():
                m[c] = level
                m["errors"].pop(c, None)
        m.setdefault("closed", {}).update(doc.get("closed", {}))
        m["errors"].update(doc.get("errors", {}))
        merge_warmups(m, doc.get("warmup"))
        if "error" in doc:
            m["run_errors"].append(f"{f.name}: {doc['error']}")
        if "cold_start_s" in doc:
            m["cold_start_s"].append(doc["cold_start_s"])
    return merged


def merge_warmups(merged: dict[str, Any], warmup: dict[str, Any] | None) -> None:
    """A part's warm-up record into its config's: per-level records (benchmarks.common.warmup)
    add up; a file from before them (one round at the highest level) is kept as it was."""
    if not warmup:
        return
    if "levels" not in warmup:
        merged["warmup_before_levels"] = warmup
        return
    into = merged.setdefault("warmup", {"how": warmup["how"], "levels": {}})
    into["levels"].update(warmup["levels"])


def peer_table(out: Path, concurrency: list[int], stream: dict[str, Any], family: str = "qwen2_5_omni") -> list[str]:
    """Markdown lines for the vllm-omni results of `family` in `out` (peer_docs): its levels next
    to omni_mp's streaming ones (`stream`: omni_gpu's or qwen3_omni_gpu's stream.json), and every
    error."""
    lines: list[str] = []
    for config, doc in peer_docs(out, family).items():
        lines += config_lines(config, doc, concurrency, stream)
    if lines:
        first = {
            "qwen2_5_omni": "its first audio is its last",
            "qwen3_omni": "its first audio is its first streamed chunk at the caller",
        }[family]
        lines.insert(0, f"\nvllm-omni on the same GPU, same model dir, prompts and lengths ({first}):")
    return lines


def config_lines(config: str, doc: dict[str, Any], concurrency: list[int], stream: dict[str, Any]) -> list[str]:
    """One vllm-omni config's table (`peer_docs`' merged doc) beside omni_mp's `stream` levels."""
    name = f"{doc.get('system', 'vllm-omni')}, config {config} ({doc.get('overlay', '')})"
    colds = ", ".join(f"{x:.0f} s" for x in doc["cold_start_s"])
    lines = ["", f"**{name}**" + (f": cold start {colds}" if colds else "")]
    lines += [
        "| concurrency | first audio p50 / p90 | omni_mp p50 | RTF | audio s/s | omni_mp / it "
        "| thinker tok/s | omni_mp / it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in concurrency:
        p, o = doc.get(str(c)), stream.get(str(c), {})
        if p is None:
            err = doc["errors"].get(str(c)) or ("failed (below)" if doc["run_errors"] else "not run")
            lines.append(f"| {c} | {err[:200]} | | | | | | |")
            continue

        def ratio(key: str, p: dict[str, Any] = p, o: dict[str, Any] = o) -> str:
            return f"{o[key] / p[key]:.1f}x" if o.get(key) and p.get(key) else "-"

        om = f"{o['first_audio_p50_s'] * 1000:.0f} ms" if "first_audio_p50_s" in o else "-"
        lines.append(
            f"| {c} | {p['first_audio_p50_s'] * 1000:.0f} / {p['first_audio_p90_s'] * 1000:.0f} ms | {om} "
            f"| {p['rtf_mean']:.2f} | {p['audio_s_per_s']:.2f} | {ratio('audio_s_per_s')} "
            f"| {p['thinker_tok_s']:.0f} | {ratio('thinker_tok_s')} |"
        )
    # Against omni_mp's own audio per request at that level (both trim the decoder's tail),
    # else the nominal length.
    want = {
        c: stream.get(c, {}).get("audio_s_per_request", doc[c]["audio_s_expected"])
        for c in doc
        if c.isdigit() and "audio_s_expected" in doc[c]
    }
    odd = {c: doc[c]["audio_s_per_request"] for c in want if abs(doc[c]["audio_s_per_request"] - want[c]) > 1e-6}
    if odd:
        theirs = {c: want[c] for c in odd}
        lines.append(f"audio per request (s) differs from omni_mp's {theirs}: {odd}")
    lines += closed_loop_rows(doc.get("closed") or {}, stream.get("closed") or {})
    lines += warmup_lines(doc)
    lines += [f"run failed: {e[:1500]}" for e in doc["run_errors"]]
    return lines


def warmup_lines(doc: dict[str, Any]) -> list[str]:
    """How the peer's levels were warmed up: per level, or (files from before that) one round
    before all of them."""
    line = warmup_line(doc.get("warmup"), "vllm-omni")
    if line:
        return [line]
    old = doc.get("warmup_before_levels")
    if old:
        return [f"warm-up (vllm-omni): one round of {old.get('requests')} requests before all levels"]
    return []


def closed_loop_rows(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """The closed-loop levels (--closed-loop) of the peer beside omni_mp's."""
    if not theirs:
        return []
    lines = [
        "closed loop (c in flight, each finished request replaced):",
        "| concurrency | requests | first audio mean / p50 | omni_mp mean / p50 | RTF | omni_mp RTF | audio s/s "
        "| omni_mp / it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, p in theirs.items():
        o = ours.get(c)
        om = f"{o['first_audio_mean_s'] * 1000:.0f} / {o['first_audio_p50_s'] * 1000:.0f} ms" if o else "-"
        om_rtf = f"{o['rtf_mean']:.3f}" if o else "-"
        ratio = f"{o['audio_s_per_s'] / p['audio_s_per_s']:.1f}x" if o else "-"
        lines.append(
            f"| {c} | {p['requests']} | {p['first_audio_mean_s'] * 1000:.0f} / {p['first_audio_p50_s'] * 1000:.0f} ms "
            f"| {om} | {p['rtf_mean']:.3f} | {om_rtf} | {p['audio_s_per_s']:.2f} | {ratio} |"
        )
    return lines

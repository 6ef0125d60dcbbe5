"""Where a served request's first audio goes, from an omni_mp server's own `/metrics`.

Scraped before and after a measured window, the per-stage histograms' sums and counts give the
mean over the requests that finished in it of each stage's time from receiving the request to being
handed to its engine (`omni_mp_stage_time_to_start_seconds`: preparation; a downstream stage
also waits there for its first input) and to its first output (`..._time_to_first_token_seconds`),
and the HTTP server's time from receiving a request to its first audio bytes; for an entry
stage, its preparation by part (`omni_mp_stage_prepare_seconds`: queued for a preparer, the
model's input built, the engine's request built, waiting for the engine thread between steps). The
coordinator sends every stage on a request's path its registration at admission, so each is
measured from about the same instant.
A server without these metrics (another system's) gives None.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

START = "omni_mp_stage_time_to_start_seconds"
FIRST = "omni_mp_stage_time_to_first_token_seconds"
HTTP_FIRST_AUDIO = "omni_mp_http_time_to_first_audio_seconds"
PREPARE = "omni_mp_stage_prepare_seconds"
Sums = dict[str, tuple[float, float]]  # "family/stage id or endpoint" -> (_sum, _count)


async def scrape(http: httpx.AsyncClient, url: str) -> Sums | None:
    try:
        r = await http.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(r.text):
        if family.name not in (START, FIRST, HTTP_FIRST_AUDIO, PREPARE):
            continue
        for s in family.samples:
            if s.name in (f"{family.name}_sum", f"{family.name}_count"):
                key = f"{family.name}/{s.labels.get('stage_id', 'http')}"
                if "part" in s.labels:
                    key += f"/{s.labels['part']}"
                out.setdefault(key, [0.0, 0.0])[s.name.endswith("_count")] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()} or None


def breakdown(before: Sums | None, after: Sums | None) -> dict[str, Any] | None:
    """Mean ms per part over the window's finished requests: {"stage 0": {"start": .., "first":
    ..}, ..., "http first audio": ..}; None without both scrapes."""
    if before is None or after is None:
        return None

    def mean(key: str) -> float | None:
        s1, n1 = after.get(key, (0.0, 0.0))
        s0, n0 = before.get(key, (0.0, 0.0))
        return 1000 * (s1 - s0) / (n1 - n0) if n1 > n0 else None

    stages = sorted({k.split("/")[1] for k in after if not k.endswith("/http")}, key=int)
    out: dict[str, Any] = {f"stage {s}": {"start": mean(f"{START}/{s}"), "first": mean(f"{FIRST}/{s}")} for s in stages}
    for key in after:
        if key.startswith(f"{PREPARE}/"):
            _, stage, part = key.split("/")
            out[f"stage {stage}"].setdefault("prepare", {})[part] = mean(key)
    out["http first audio"] = mean(f"{HTTP_FIRST_AUDIO}/http")
    return out


def line(parts: dict[str, Any] | None) -> str | None:
    """One printable line of `breakdown`'s means."""
    if not parts:
        return None
    bits = []
    for name, v in parts.items():
        if isinstance(v, dict):
            prep = v.get("prepare")
            prep_text = f" (preparation: {', '.join(f'{k} {_ms(x)}' for k, x in prep.items())})" if prep else ""
            bits.append(f"{name}: in its engine {_ms(v['start'])}{prep_text}, first output {_ms(v['first'])}")
        else:
            bits.append(f"HTTP request received -> first audio bytes {_ms(v)}")
    return "mean ms from each stage's receipt of the request: " + "; ".join(bits)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"

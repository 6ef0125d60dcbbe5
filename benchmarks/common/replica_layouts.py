"""Stage-replica layouts of the three-stage omni benchmarks (omni_gpu.py, qwen3_omni_gpu.py:
`--layout`), and the scaling efficiency of a run against a one-GPU run of the same build
(`--baseline DIR`: that run's --out).

Layouts (stages: AR thinker, AR talker, audio decoder; `--gpus 2` unless said):
  split        thinker on GPU 0, talker + decoder on GPU 1 (the benchmarks' own two-GPU layout)
  decoder_x2   as split, plus a second decoder replica on GPU 0 beside the thinker
  talker_decoder_x2
               thinker on GPU 0; talker and decoder one replica on each GPU
  full_x2      every stage replicated, one whole pipeline per GPU (the router binds each
               request to one replica of each stage; links cross the GPUs)
  decoder_mps_x2 / talker_mps_x2
               the split layout with two replicas of that stage on GPU 1 (MPS clients under
               gpu_sharing auto): does a second process on one GPU pay?
Budgets: a GPU that holds all three stages gets the one-GPU shares; the decoder beside the
thinker alone gets the decoder's one-GPU share taken from the thinker's; two replicas of a
stage on one GPU split that stage's share.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LAYOUTS = ["split", "decoder_x2", "talker_decoder_x2", "full_x2", "decoder_mps_x2", "talker_mps_x2"]


def apply_layout(
    stages: list[dict[str, Any]], layout: str, one_gpu: list[float] | None, two_gpu: list[float] | None
) -> None:
    """Set replicas, devices and memory budgets (GiB: the benchmark's shares for one and two
    GPUs, thinker / talker / decoder) of the benchmark's three stage dicts for `layout`.
    Budgets None (--smoke, CPU): only the replica counts."""
    if one_gpu is None or two_gpu is None:
        counts = {"decoder_x2": (1, 1, 2), "talker_decoder_x2": (1, 2, 2), "full_x2": (2, 2, 2)}
        counts |= {"decoder_mps_x2": (1, 1, 2), "talker_mps_x2": (1, 2, 1)}
        for s, n in zip(stages, counts.get(layout, (1, 1, 1)), strict=True):
            s["replicas"] = n
        return
    thinker, talker, decoder = stages
    budgets = list(two_gpu)
    if layout == "split":
        pass
    elif layout == "decoder_x2":
        _replicate(decoder, [[1], [0]])
        budgets[0] = two_gpu[0] - one_gpu[2]  # the thinker makes room for the decoder on GPU 0
        budgets[2] = one_gpu[2]
    elif layout in ("talker_decoder_x2", "full_x2"):
        for s in (talker, decoder) if layout == "talker_decoder_x2" else (thinker, talker, decoder):
            _replicate(s, [[0], [1]])
        budgets = list(one_gpu)  # GPU 0 holds all three stages
    elif layout in ("decoder_mps_x2", "talker_mps_x2"):
        i = 2 if layout == "decoder_mps_x2" else 1
        stages[i]["replicas"] = 2  # both on the stage's GPU (its `devices`)
        budgets[i] = round(two_gpu[i] / 2, 1)
    else:
        raise SystemExit(f"unknown layout {layout!r}; known: {LAYOUTS}")
    for s, gib in zip(stages, budgets, strict=True):
        s.setdefault("memory", {})["gpu_gib"] = round(gib, 1)


def _replicate(stage: dict[str, Any], devices: list[list[int]]) -> None:
    stage.pop("devices", None)
    stage["replicas"] = len(devices)
    stage["replica_devices"] = devices


def scaling_lines(results: dict[str, Any], baseline_dir: Path | None, gpus: int, levels: list[int]) -> list[str]:
    """Per level: audio s/s here and on one GPU, and the scaling efficiency
    throughput(N GPUs) / (N x throughput(one GPU)); empty without a baseline run."""
    if baseline_dir is None:
        return []
    path = baseline_dir / "stream.json"
    try:
        base = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return [f"\nscaling efficiency: no one-GPU baseline ({path}: {err})"]
    here = results.get("stream", {})
    lines = [
        "",
        f"scaling efficiency against the one-GPU run in {baseline_dir} "
        f"(audio s/s on {gpus} GPUs / ({gpus} x one GPU's)):",
        "",
        "| concurrency | audio s/s | one GPU | efficiency | RTF | first audio p50 / p90 |",
        "|---|---|---|---|---|---|",
    ]
    for c in levels:
        a, b = here.get(str(c), {}), base.get(str(c), {})
        ours, one = a.get("audio_s_per_s"), b.get("audio_s_per_s")
        eff = f"{ours / (gpus * one):.2f}" if ours and one else "-"
        p50, p90 = a.get("first_audio_p50_s"), a.get("first_audio_p90_s")
        first = f"{p50 * 1e3:.0f} / {p90 * 1e3:.0f} ms" if p50 is not None and p90 is not None else "-"
        lines.append(
            f"| {c} | {ours or float('nan'):.2f} | {one or float('nan'):.2f} | {eff} "
            f"| {a.get('rtf_mean', float('nan')):.3f} | {first} |"
        )
    return lines

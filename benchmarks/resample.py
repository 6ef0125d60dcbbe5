"""Resampling to 16 kHz (the Qwen2.5-Omni processor's rate): omni_mp's resampler (libsoxr,
`omni_mp.media.audio_io.resample`) against the Kaiser-windowed sinc it replaced, on `--seconds` of
audio at 44.1, 48, 22.05 and 8 kHz and at 44,101 Hz (coprime to 16,000).

Each run is its own subprocess: wall time of one call, and peak memory as the rise of the
process's peak resident set (VmHWM, reset just before the call) over its resident set then,
so allocations of C libraries and torch count too. The old resampler is run only where its
[up, n_in] intermediate stays under --max-old-gb (it is skipped with the reason otherwise).
Where both run, the relative L2 difference of their outputs on an in-band signal (tones at
440 Hz and 3 kHz, away from the edges) is reported too.

    python -m benchmarks.resample [--seconds 60] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common.phases import REPO, module_cmd
from omni_mp.media.audio_io import resample

TARGET = 16_000
RATES = (44_100, 48_000, 22_050, 8_000, 44_101)


def old_resample(samples: np.ndarray, orig_rate: int, target_rate: int, zeros: int = 16) -> np.ndarray:
    """The resampler omni_mp used before soxr (a Kaiser-windowed sinc, polyphase: one filter
    per output phase, convolved at full rate and gathered), kept here as the baseline."""
    import torch

    g = math.gcd(orig_rate, target_rate)
    up, down = target_rate // g, orig_rate // g
    cutoff = min(1.0, up / down)
    width = math.ceil(zeros / cutoff)
    x = (
        torch.arange(-width, width + 1, dtype=torch.float64)[None, :]
        - torch.arange(up, dtype=torch.float64)[:, None] / up
    )
    beta = torch.tensor(8.6, dtype=torch.float64)
    window = torch.special.i0(beta * torch.sqrt((1 - (x / (width + 1)) ** 2).clamp(min=0))) / torch.special.i0(beta)
    taps = (cutoff * torch.sinc(cutoff * x) * window).to(torch.float32)
    n_out = math.ceil(samples.size * up / down)
    padded = torch.nn.functional.pad(torch.from_numpy(samples)[None, None], (width, width + down + 1))
    frames = torch.nn.functional.conv1d(padded, taps[:, None, :])[0]  # [up, n_in + down + 2]
    k = torch.arange(n_out)
    return frames[(k * down) % up, (k * down) // up].numpy()


def old_bytes(n_in: int, orig_rate: int) -> int:
    """What the old resampler allocates: twice its [up, n_in + down + 2] float32 convolution
    output (the issue measured +3.2 GB at 44.1 kHz, where that output is 1.7 GB)."""
    g = math.gcd(orig_rate, TARGET)
    up, down = TARGET // g, orig_rate // g
    return 2 * up * (n_in + down + 2) * 4


def signal(rate: int, seconds: float, noise: float = 0.01) -> np.ndarray:
    """Tones at 440 Hz and 3 kHz plus `noise` times seeded white noise, float32."""
    t = np.arange(int(seconds * rate)) / rate
    hiss = np.random.default_rng(0).standard_normal(t.size) * noise
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 3000 * t) + hiss).astype(np.float32)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(impl: str, rate: int, seconds: float) -> None:
    """One timed call in this process; prints {"time_s", "peak_mb", "n_out"} as JSON."""
    fn = resample if impl == "soxr" else old_resample
    x = signal(rate, seconds)
    fn(x[: rate // 10], rate, TARGET)  # warm-up: imports, first-call set-up
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages would hide new allocations
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    y = fn(x, rate, TARGET)
    elapsed = time.perf_counter() - t0
    peak_mb = (_status_kb("VmHWM") - before) / 1024
    print(json.dumps({"time_s": elapsed, "peak_mb": peak_mb, "n_out": int(y.size)}))


def run_child(impl: str, rate: int, seconds: float) -> dict:
    cmd = module_cmd("benchmarks.resample", "--child", impl, str(rate), "--seconds", str(seconds))
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def in_band_difference(rate: int) -> float:
    """Relative L2 difference of the two resamplers on 5 s of the tones (no noise: the filters
    differ by design near the Nyquist frequency), 0.1 s from the edges."""
    x = signal(rate, 5.0, noise=0.0)
    a, b = resample(x, rate, TARGET), old_resample(x, rate, TARGET)
    n, edge = min(a.size, b.size), TARGET // 10
    return float(np.linalg.norm(a[edge : n - edge] - b[edge : n - edge]) / np.linalg.norm(b[edge : n - edge]))


def measure(rate: int, seconds: float, max_old_gb: float) -> dict:
    row: dict = {"rate": rate, "soxr": run_child("soxr", rate, seconds)}
    need = old_bytes(int(seconds * rate), rate) / 2**30
    if need > max_old_gb:
        row["old_skipped"] = f"needs ~{need:,.1f} GB > --max-old-gb {max_old_gb:g}"
    else:
        row["old"] = run_child("old", rate, seconds)
        row["rel_difference"] = in_band_difference(rate)
    return row


def markdown(rows: list[dict], seconds: float) -> str:
    head = f"{seconds:g} s of audio -> {TARGET} Hz: time and peak memory of one call (own process)\n\n"
    out = [
        "| input rate | up/down | soxr time | soxr peak | old time | old peak | in-band rel. difference |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        g = math.gcd(r["rate"], TARGET)
        s = r["soxr"]
        old = [f"{r['old']['time_s'] * 1e3:.0f} ms", f"{r['old']['peak_mb']:.0f} MB"] if "old" in r else ["skipped", ""]
        diff = f"{r['rel_difference']:.1e}" if "rel_difference" in r else r.get("old_skipped", "")
        cells = [f"{r['rate']:,} Hz", f"{TARGET // g}/{r['rate'] // g}", f"{s['time_s'] * 1e3:.1f} ms"]
        out.append("| " + " | ".join([*cells, f"{s['peak_mb']:.1f} MB", *old, diff]) + " |")
    return head + "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-old-gb", type=float, default=2.0, help="skip the old resampler above this")
    p.add_argument("--out", type=Path, help="write resample.json and resample.md here")
    p.add_argument("--child", nargs=2, metavar=("IMPL", "RATE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.seconds)
        return
    rows = []
    for rate in RATES:
        rows.append(measure(rate, args.seconds, args.max_old_gb))
        if "old_skipped" in rows[-1]:
            print(f"{rate} Hz: old resampler skipped: {rows[-1]['old_skipped']}", file=sys.stderr)
    table = markdown(rows, args.seconds)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "resample.json").write_text(json.dumps({"seconds": args.seconds, "rows": rows}, indent=1))
        (args.out / "resample.md").write_text(table)


if __name__ == "__main__":
    main()

"""What `import omni_mp.client.omni_client` costs a process: wall time and peak RSS, median of fresh
interpreters (each run is a new process, so nothing is cached in-process).

    python -m benchmarks.client_import [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROBE = """
import json, resource, sys, time
t0 = time.perf_counter()
import omni_mp.client.omni_client
dt = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"s": dt, "rss": rss, "torch": "torch" in sys.modules, "vllm": "vllm" in sys.modules}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    runs = [json.loads(subprocess.check_output([sys.executable, "-c", PROBE], text=True)) for _ in range(args.runs)]
    print(
        f"import omni_mp.client.omni_client: {statistics.median(r['s'] for r in runs):.2f} s, "
        f"peak RSS {statistics.median(r['rss'] for r in runs) / 2**20:.0f} MiB "
        f"(median of {args.runs}); torch imported: {runs[0]['torch']}, vllm imported: {runs[0]['vllm']}"
    )


if __name__ == "__main__":
    main()

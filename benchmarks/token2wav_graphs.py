"""token2wav with CUDA graphs against eager on one GPU, speed per solver step (the diffusion runner,
no vLLM needed): the timing half of what was launch/gpu_token2wav_graphs_check.py (its checks,
equal outputs in fp32 and no captures after the start-up warm-up, are
tests/gpu/test_token2wav_graphs.py, which uses the runners and windows defined here).

    python -m benchmarks.token2wav_graphs                  # default size, exact fp32
    python -m benchmarks.token2wav_graphs --matmul high    # TF32
    python -m benchmarks.token2wav_graphs --contenders 0   # alone only
    python -m benchmarks.token2wav_graphs --tiny --cpu     # a CPU smoke run (eager only)

Runners on the same model: `eager` (each step at its own size) and `graphs` (each step padded to
its batch/length bucket and replayed from a CUDA graph). Speed: ms per solver step (wall,
synchronized) of eager and graphs for a batch of b 84-code windows, alone and, with
--contenders N (default 2), while N other processes replay a CUDA graph of small matmuls in a
loop (a decode step's launch pattern); then the vocoder alone, eager and replayed. Every batch
size runs once unmeasured first (on a first use the graphs runner captures its bucket).
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time
from typing import Any

import torch

from benchmarks.common.cuda_timing import open_device, wall_ms
from benchmarks.common.phases import REPO, int_list, module_cmd
from benchmarks.common.token2wav_options import T2W_COMPILE, T2W_DTYPES


class EagerBuckets:
    """A GraphSet's `wrap` without graphs: the runner pads to buckets and runs eagerly."""

    def wrap(self, fn: Any, name: str) -> Any:
        return fn


def contender(seconds: float) -> None:
    """Replay a CUDA graph of 256 small matmuls (about a decode step's launch count) in a loop."""
    dev = torch.device("cuda:0")
    a = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16) / 32
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(2):
            h = a
            for _ in range(256):
                h = torch.tanh(h @ w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        h = a
        for _ in range(256):
            h = torch.tanh(h @ w)
    print("contender ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        g.replay()
        torch.cuda.synchronize()


def windows(model: Any, b: int, codes: int, seed: int, mixed: bool) -> list[Any]:
    """b one-shot windows of `codes` random codes (with `mixed`, some rows shorter)."""
    from omni_mp.engines.diffusion.model import Window
    from omni_mp.engines.diffusion.params import DiffusionParams

    out = []
    for i in range(b):
        n = codes if not mixed or i % 3 else max(12, codes - 36 - (i % 5))  # some shorter rows
        ids = torch.randint(0, model.num_codes - 1, (n,), generator=torch.Generator().manual_seed(seed + i))
        out.append(Window(f"r{i}", ids, 0, DiffusionParams(seed=seed + i, speaker="Chelsie")))
    return out


def solve(runner: Any, wins: list[Any], sync: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Every window to the end: audio per request and the wall time of each step."""
    from omni_mp.engines.diffusion.batcher import StepPlan, TrajectorySpec
    from omni_mp.engines.diffusion.chunking import one_shot

    specs = [TrajectorySpec(i, w, one_shot(w.ids.numel())) for i, w in enumerate(wins)]
    plan = StepPlan(new=specs, step_ids=[s.traj_id for s in specs], freed=[], total_num_scheduled_tokens=len(specs))
    out: dict[str, torch.Tensor] = {}
    times: list[float] = []
    while True:
        t0 = time.perf_counter()
        result = runner.execute(plan)
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if result.errors:
            raise RuntimeError(result.errors)
        for rid, (samples, _) in result.outputs.items():
            out[rid] = samples
        live = [t for t in plan.step_ids if t not in result.done]
        if not live:
            break
        plan = StepPlan(new=[], step_ids=live, freed=[], total_num_scheduled_tokens=len(live))
    runner.noise.clear()
    runner.joiners.clear()
    return out, times


def load_model(tiny: bool, device: torch.device, dtype: str, compile_: str) -> Any:
    """token2wav at transformers' default size (or the tiny one) with these model options."""
    from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav
    from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel

    spec = TOKEN2WAV_SPECS["tiny-token2wav" if tiny else "token2wav-default-size"]
    return Token2WavModel.from_checkpoint(build_token2wav(spec), device, **T2W_DTYPES[dtype], **T2W_COMPILE[compile_])


def runners(model: Any, cuda: bool) -> tuple[Any, Any | None]:
    """An eager runner and (on a GPU) a runner with CUDA graphs, each on its own view of the
    weights (a runner with graphs or buckets hands its model the graph set for the vocoder)."""
    from omni_mp.engines.diffusion.graphs import GraphSet
    from omni_mp.engines.diffusion.params import DiffusionStageConfig
    from omni_mp.engines.diffusion.runner import DiffusionRunner

    cfg = DiffusionStageConfig()
    kw: dict[str, Any] = {"graph_batch_sizes": cfg.graph_batch_sizes, "graph_max_frames": cfg.graph_max_frames}
    eager = DiffusionRunner(copy.copy(model), 0)
    graphs = DiffusionRunner(copy.copy(model), 0, GraphSet(cfg.max_graphs), **kw) if cuda else None
    return eager, graphs


def timing(
    model: Any, eager: Any, graphs: Any | None, batches: list[int], repeats: int, cuda: bool, label: str
) -> None:
    """ms per solver step of a batch of b 84-code windows, eager and from graphs."""
    print(f"\n## ms per solver step, a batch of b 84-code windows (9 steps + decode), {label}")
    print("| b | eager | graphs | speed-up |\n|---|---|---|---|")
    for b in batches:
        wins = windows(model, b, 84, 7 * b, False)
        row = []
        for runner in (eager, graphs):
            if runner is None:
                row.append(float("nan"))
                continue
            solve(runner, wins, cuda)  # warm (captures on the first use of a bucket)
            meds = []
            for _ in range(repeats):
                _, ts = solve(runner, wins, cuda)
                meds.append(sorted(ts)[len(ts) // 2])
            row.append(1000 * min(meds))
        print(f"| {b} | {row[0]:.1f} | {row[1]:.1f} | {row[0] / row[1]:.2f}x |", flush=True)


def vocoder_alone(model: Any, batches: list[int], device: torch.device, cuda: bool) -> None:
    """The vocoder on b 168-frame windows (84 codes): best of 4, eager and replayed from a graph."""
    from omni_mp.engines.diffusion.graphs import GraphSet
    from omni_mp.engines.diffusion.params import DiffusionStageConfig

    print("\n## vocoder alone, b 168-frame windows (84 codes): ms, best of 4, eager / replayed from a graph")
    voc = GraphSet(DiffusionStageConfig().max_graphs).wrap(model._vocode, "vocoder-168") if cuda else None
    for b in batches:
        mel = torch.randn(b, model.state_dim, 168, device=device) - 4.0
        model._vocode(mel)  # this size's first run, unmeasured
        best = min(wall_ms(lambda: model._vocode(mel)) for _ in range(4))  # noqa: B023 (called at once)
        line = f"- b={b}: eager {best:.1f} ms"
        if voc is not None and voc.ready(mel):
            line += f", replayed {min(wall_ms(lambda: voc(mel)) for _ in range(4)):.1f} ms"  # noqa: B023
        print(line, flush=True)


def next_to_contenders(n: int, run: Any) -> None:
    """`run()` while n processes replay CUDA graphs of their own (what the thinker and talker do)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            cmd = module_cmd("benchmarks.token2wav_graphs", "--contender", "240")
            procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE))
        for p in procs:
            assert p.stdout is not None
            p.stdout.readline()  # "contender ready"
        run()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matmul", choices=["highest", "high"], default="highest")
    ap.add_argument("--dtype", choices=list(T2W_DTYPES), default="float32", help="token2wav's weights (model_options)")
    ap.add_argument("--compile", choices=list(T2W_COMPILE), default="all", help="token2wav's torch.compile")
    ap.add_argument("--batches", type=int_list, default=[1, 8, 32])
    ap.add_argument("--contenders", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="timed solves per case (median step time kept)")
    ap.add_argument("--tiny", action="store_true", help="the tiny token2wav (smoke)")
    ap.add_argument("--cpu", action="store_true", help="CPU smoke run: eager only")
    ap.add_argument("--contender", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.contender is not None:
        contender(args.contender)
        return 0
    cuda = not args.cpu
    device = open_device(args.cpu, args.matmul)
    if device is None:
        return 2
    t0 = time.perf_counter()
    model = load_model(args.tiny, device, args.dtype, args.compile)
    print(f"# {torch.cuda.get_device_name(0) if cuda else 'CPU'}; {'tiny' if args.tiny else 'default-size'} "
          f"token2wav, float32_matmul {args.matmul}, weights {args.dtype}, compile {args.compile}; "
          f"loaded in {time.perf_counter() - t0:.1f}s")  # fmt: skip
    eager, graphs = runners(model, cuda)
    timing(model, eager, graphs, args.batches, args.repeats, cuda, "alone")
    vocoder_alone(model, args.batches, device, cuda)
    if cuda and args.contenders:
        label = f"next to {args.contenders} processes replaying CUDA graphs"

        def timed_beside() -> None:
            timing(model, eager, graphs, args.batches, args.repeats, cuda, label)

        next_to_contenders(args.contenders, timed_beside)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

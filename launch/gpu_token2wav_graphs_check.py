"""token2wav with CUDA graphs vs eager on one GPU (the diffusion runner, no vLLM needed):
equal outputs in fp32, and the speed per solver step at batch 1/8/32, alone and next to
processes that replay CUDA graphs of their own (what the thinker and talker do on one GPU).

    python launch/gpu_token2wav_graphs_check.py                  # default size, exact fp32
    python launch/gpu_token2wav_graphs_check.py --matmul high    # TF32
    python launch/gpu_token2wav_graphs_check.py --contenders 0   # alone only
    python launch/gpu_token2wav_graphs_check.py --tiny --cpu     # a CPU smoke run (eager only)

Three runners on the same model: `eager` (today's path: each step at its own size),
`padded` (each step padded to its graph bucket, run eagerly) and `graphs` (the same buckets
replayed from CUDA graphs). Checks, per batch size, on streaming-sized windows (a 36-code
first chunk and 84-code later windows, mixed lengths) and a one-shot 200-code request:
- the DiT velocity replayed from its graph == the same bucket run eagerly, bit for bit;
- audio: graphs vs padded and vs eager, max abs difference, bounded by --atol (padding changes
  kernel shapes only). Not bit for bit: the vocoder alone is not deterministic run to run on
  an H200 (the same input twice, eagerly: max |diff| 7.5e-5 to 8.8e-5, measured 2026-11-24;
  cuDNN's transposed convolutions), which the check reports as "vocoder run to run".
Start-up warm-up: the graphs `warm_up_graphs` captures and what that costs; then requests of
the streamed window sizes and a last chunk's odd size, which must capture no more graphs; and
the vocoder at an odd length eager vs captured vs replayed.
Speed: ms per solver step (wall, synchronized) of eager and graphs for a batch of b 84-code
windows, alone and, with --contenders N (default 2), while N other processes replay a CUDA
graph of small matmuls in a loop (a decode step's launch pattern). Exit code 0 when every
check passes.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.omni_gpu import T2W_COMPILE, T2W_DTYPES, use_precision  # noqa: E402
from omni_mp.engines.diffusion.batcher import StepPlan, TrajectorySpec  # noqa: E402
from omni_mp.engines.diffusion.chunking import one_shot  # noqa: E402
from omni_mp.engines.diffusion.graphs import GraphSet  # noqa: E402
from omni_mp.engines.diffusion.model import Window  # noqa: E402
from omni_mp.engines.diffusion.params import DiffusionParams, DiffusionStageConfig  # noqa: E402
from omni_mp.engines.diffusion.runner import DiffusionRunner  # noqa: E402
from omni_mp.models.qwen2_5_omni.tiny import TOKEN2WAV_SPECS, build_token2wav  # noqa: E402
from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel  # noqa: E402


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


def windows(model: Token2WavModel, b: int, codes: int, seed: int, mixed: bool) -> list[Window]:
    out = []
    for i in range(b):
        n = codes if not mixed or i % 3 else max(12, codes - 36 - (i % 5))  # some shorter rows
        ids = torch.randint(0, model.num_codes - 1, (n,), generator=torch.Generator().manual_seed(seed + i))
        out.append(Window(f"r{i}", ids, 0, DiffusionParams(seed=seed + i, speaker="Chelsie")))
    return out


def solve(runner: DiffusionRunner, wins: list[Window], sync: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Every window to the end: audio per request and the wall time of each step."""
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


def velocity_replay_is_eager(runner: DiffusionRunner, wins: list[Window]) -> bool:
    """One DiT velocity call at the windows' bucket: replayed from its graph vs run eagerly."""
    model, dev = runner.model, runner.model.device
    conds = [model.condition(w) for w in wins]
    shape = runner.graph_shape(len(conds), max(c.frames for c in conds))
    assert shape is not None
    batch = model.collate(conds, torch.tensor([w.params.guidance_scale for w in wins]), pad_to=shape)
    x = torch.randn(*shape, model.state_dim, device=dev, generator=torch.Generator(dev).manual_seed(1))
    t = torch.rand(shape[0], device=dev, generator=torch.Generator(dev).manual_seed(2))
    return torch.equal(runner._velocity(batch, x, t), model.velocity(batch, x, t))  # type: ignore[misc]


def open_device(cpu: bool, matmul: str) -> torch.device | None:
    """cuda:0, or the CPU for a smoke run, with what a stage of that `float32_matmul` runs with
    (matmuls and cuDNN convolutions); None when there is no CUDA device."""
    if not cpu and not torch.cuda.is_available():
        print("no CUDA device (use --cpu for the smoke run)")
        return None
    use_precision(matmul)
    return torch.device("cpu" if cpu else "cuda:0")


def wall_ms(fn: Any) -> float:
    """Wall ms of one call of `fn`, synchronized on a GPU."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0)


def warm_up_check(model: Token2WavModel, cfg: DiffusionStageConfig, kw: dict[str, Any], batches: list[int]) -> bool:
    """The start-up capture (`DiffusionRunner.warm_up_graphs`): its cost, then streamed-size
    windows and a last chunk's odd length at each batch size, which must capture nothing
    more; and the vocoder at that odd length eager vs captured vs replayed (why the warm-up
    leaves other lengths eager)."""
    print("\n## start-up graph warm-up (streaming defaults)")
    graphs = GraphSet(cfg.max_graphs)
    runner = DiffusionRunner(copy.copy(model), 0, graphs, **kw)
    params = DiffusionParams(seed=0, speaker="Chelsie")
    plan = runner.warm_up_plan(cfg.streaming, max(batches))
    warm = runner.warm_up_graphs(cfg.streaming, max(batches), params)
    before = {k: v[0] for k, v in graphs.stats().items()}
    print(f"- {warm.graphs} graphs captured in {warm.seconds:.1f}s (DiT buckets planned: {len(plan)}; {before})")
    ok = warm.graphs > 0
    for b in batches:
        for codes in (36, 84, 70):  # first chunk, steady chunk, a last chunk
            _, ts = solve(runner, windows(model, b, codes, 31 * b + codes, False), True)
            med = 1000 * sorted(ts)[len(ts) // 2]
            print(f"- b={b} {codes}-code windows: slowest step {1000 * max(ts):.1f} ms, median {med:.1f} ms")
    after = {k: v[0] for k, v in graphs.stats().items()}
    print(f"- graphs after the requests: {after} (must equal the warm-up's)")
    ok &= after == before
    mel = torch.randn(1, model.state_dim, 140, device=model.device)
    model._vocode(mel)  # kernels loaded
    eager = sorted(wall_ms(lambda: model._vocode(mel)) for _ in range(5))[2]
    one = GraphSet(cfg.max_graphs).wrap(model._vocode, "vocoder-140")
    capture = wall_ms(lambda: one.ready(mel))
    replay = sorted(wall_ms(lambda: one(mel)) for _ in range(5))[2]
    print(f"- vocoder, one 140-frame window: eager {eager:.1f} ms, capture {capture:.1f} ms, replay {replay:.1f} ms")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matmul", choices=["highest", "high"], default="highest")
    ap.add_argument(
        "--dtype", choices=list(T2W_DTYPES), default="float32",
        help="token2wav's model_options: bf16 DiT (bfloat16-dit) or DiT and vocoder (bfloat16), opt-in precisions",
    )  # fmt: skip
    ap.add_argument(
        "--compile", choices=list(T2W_COMPILE), default="all",
        help="token2wav's model_options: torch.compile the DiT block (dit) or that and the vocoder's activations (all)",
    )  # fmt: skip
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contenders", type=int, default=2)
    ap.add_argument("--atol", type=float, default=1e-3, help="graphs vs eager (unpadded) audio bound")
    ap.add_argument("--repeats", type=int, default=3, help="timed solves per case (median step time kept)")
    ap.add_argument("--tiny", action="store_true", help="the tiny token2wav (smoke)")
    ap.add_argument("--cpu", action="store_true", help="CPU smoke run: eager and padded only")
    ap.add_argument("--contender", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.contender is not None:
        contender(args.contender)
        return 0
    cuda = not args.cpu
    device = open_device(args.cpu, args.matmul)
    if device is None:
        return 2
    spec = TOKEN2WAV_SPECS["tiny-token2wav" if args.tiny else "token2wav-default-size"]
    t0 = time.perf_counter()
    options = {**T2W_DTYPES[args.dtype], **T2W_COMPILE[args.compile]}
    model = Token2WavModel.from_checkpoint(build_token2wav(spec), device, **options)
    print(f"# {torch.cuda.get_device_name(0) if cuda else 'CPU'}; {'tiny' if args.tiny else 'default-size'} "
          f"token2wav, float32_matmul {args.matmul}, weights {args.dtype}, compile {args.compile}; "
          f"loaded in {time.perf_counter() - t0:.1f}s")  # fmt: skip
    cfg = DiffusionStageConfig()
    kw: dict[str, Any] = {"graph_batch_sizes": cfg.graph_batch_sizes, "graph_max_frames": cfg.graph_max_frames}
    # three views of the same weights: a runner with graphs (or buckets) hands its model the
    # graph set for the vocoder, so each runner gets its own
    views = [copy.copy(model) for _ in range(3)]
    eager = DiffusionRunner(views[0], 0)
    padded = DiffusionRunner(views[1], 0, EagerBuckets(), **kw)  # type: ignore[arg-type]
    graphs = GraphSet(cfg.max_graphs) if cuda else None
    runner_g = DiffusionRunner(views[2], 0, graphs, **kw) if graphs is not None else None
    ok = True
    batches = [int(x) for x in args.batches.split(",")]

    print("\n## outputs (velocity: graph == eager bit for bit; audio: max abs differences)")
    for b in batches:
        cases = (("first chunks", 36, False), ("84-code windows, mixed", 84, True), ("one shot", 200, False))
        for name, codes, mixed in cases:
            if name == "one shot" and b > 8:
                continue
            wins = windows(model, b, codes, 1000 * b + codes, mixed)
            want, _ = solve(eager, wins, cuda)
            pad, _ = solve(padded, wins, cuda)
            d_pad = max((pad[r] - want[r]).abs().max().item() for r in want)
            line = f"- b={b} {name}: padded vs eager max |diff| {d_pad:.2e}"
            if runner_g is not None:
                got, _ = solve(runner_g, wins, cuda)
                d_gp = max((got[r] - pad[r]).abs().max().item() for r in want)
                d = max((got[r] - want[r]).abs().max().item() for r in want)
                same = velocity_replay_is_eager(runner_g, wins)
                line += f"; velocity graph == eager: {same}; audio graphs vs padded {d_gp:.2e}, vs eager {d:.2e}"
                ok &= same and d <= args.atol and d_gp <= args.atol
            ok &= d_pad <= args.atol
            print(line, flush=True)
    if graphs is not None:
        print(f"graphs (captured, replays, eager calls): {graphs.stats()}")
        mel = torch.randn(8, model.state_dim, 168, device=device, generator=torch.Generator(device).manual_seed(3))
        spread = (model._vocode(mel) - model._vocode(mel)).abs().max().item()
        print(f"vocoder run to run (eager, the same 8 x 168-frame input twice): max |diff| {spread:.2e}")

    if cuda:
        ok &= warm_up_check(model, cfg, kw, batches)

    def timing(label: str) -> None:
        print(f"\n## ms per solver step, a batch of b 84-code windows (9 steps + decode), {label}")
        print("| b | eager | graphs | speed-up |\n|---|---|---|---|")
        for b in batches:
            wins = windows(model, b, 84, 7 * b, False)
            row = []
            for runner in (eager, runner_g):
                if runner is None:
                    row.append(float("nan"))
                    continue
                solve(runner, wins, cuda)  # warm (captures on the first use of a bucket)
                meds = []
                for _ in range(args.repeats):
                    _, ts = solve(runner, wins, cuda)
                    meds.append(sorted(ts)[len(ts) // 2])
                row.append(1000 * min(meds))
            print(f"| {b} | {row[0]:.1f} | {row[1]:.1f} | {row[0] / row[1]:.2f}x |", flush=True)

    timing("alone")
    print("\n## vocoder alone, b 168-frame windows (84 codes): ms, best of 3, eager / replayed from a graph")
    voc = GraphSet(cfg.max_graphs).wrap(model._vocode, "vocoder-168") if cuda else None
    for b in batches:
        mel = torch.randn(b, model.state_dim, 168, device=device) - 4.0
        best = min(wall_ms(lambda: model._vocode(mel)) for _ in range(4))  # noqa: B023 (called at once)
        line = f"- b={b}: eager {best:.1f} ms"
        if voc is not None and voc.ready(mel):
            line += f", replayed {min(wall_ms(lambda: voc(mel)) for _ in range(4)):.1f} ms"  # noqa: B023
        print(line, flush=True)
    procs: list[subprocess.Popen[bytes]] = []
    if cuda and args.contenders:
        try:
            for _ in range(args.contenders):
                procs.append(subprocess.Popen([sys.executable, __file__, "--contender", "240"], stdout=subprocess.PIPE))
            for p in procs:
                assert p.stdout is not None
                p.stdout.readline()  # "contender ready"
            timing(f"next to {args.contenders} processes replaying CUDA graphs")
        finally:
            for p in procs:
                p.kill()
                p.wait()
    print(f"\n{'ALL CHECKS PASSED' if ok else 'CHECK FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

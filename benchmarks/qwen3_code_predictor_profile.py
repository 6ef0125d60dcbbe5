"""What one talker frame's code predictor costs on one GPU (issue 22): the Qwen3-Omni talker's
15-step code predictor (`omni_mp.models.qwen3_omni.vllm_hooks_talker.CodePredictor`) at the
released sizes (5 layers, hidden 1024, 16 heads / 8 KV heads of 128, intermediate 3072, 2048
codes; random bf16 weights), built in memory under the vLLM config a talker stage gets (torch
compile on, so vLLM switches its custom ops off and sets RMSNorm's IR priority to `native`, as
the worker does), for R rows (= requests in a decode step) with greedy decoding:

- `native`: the layers' vLLM dispatch as it is in the stage (native torch forms of RMSNorm,
  rotary embedding and SiluAndMul, since the code predictor runs outside the compiled region);
- `ops`: vLLM's CUDA kernel for each of those ops;
- `fused`: as `ops`, with q/k norms and rotary embedding in one kernel and K, V written to
  the cache in one copy: what the talker runs (`EagerKernels`).

Per mode and R: ms per frame replayed from a CUDA graph (how the talker's FULL graph runs
it) and eager, and the CUDA kernels of one frame (torch.profiler). Both modes decode the same
inputs: the script prints how many of the R x 15 codes each mode shares with `native` (bf16
kernels may round differently, and a flip changes what follows) and exits 1 if a mode's graph
replay gives other codes than its eager run, or the fused kernels' layer 0 is further from a
float32 run of it than the separate kernels' (`layer_errors`).

    python3 -m benchmarks.qwen3_code_predictor_profile [--rows 1,8,32,64] [--out FILE]
    python3 -m benchmarks.qwen3_code_predictor_profile --tiny --rows 1,2   # CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.cuda_timing import kernels, sync, timed
from benchmarks.common.report import make_say

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 64}  # fmt: skip


MODES = ("native", "ops", "fused")  # EagerKernels' modes, the first the reference


say = make_say("cp_profile")


def vllm_config() -> Any:
    """The compilation settings a talker stage runs under (vLLM's defaults: VLLM_COMPILE with
    Inductor), applied as the worker applies them."""
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig

    cfg = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE))
    cfg.kernel_config.ir_op_priority.set_default()
    return cfg


def one_rank_groups(device: str) -> None:
    """vLLM's parallel groups for one process (its linear layers ask for their TP rank)."""
    import tempfile

    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    init_file = Path(tempfile.mkdtemp()) / "dist_init"
    backend = "nccl" if device == "cuda" else "gloo"
    init_distributed_environment(1, 0, f"file://{init_file}", 0, backend)
    ensure_model_parallel_initialized(1, 1)


def build(tiny: bool, device: str) -> Any:
    from omni_mp.models.qwen3_omni.tiny import released_config
    from omni_mp.models.qwen3_omni.vllm_hooks_talker import CodePredictor

    cfg = released_config().talker_config.code_predictor_config
    if tiny:
        cfg = {**cfg.to_dict(), **TINY}
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        cp = CodePredictor(cfg, "code_predictor").to(dtype)
    for p in cp.parameters():
        p.data.normal_(0.0, 0.02)
    for m in cp.modules():  # what vLLM's loader does after loading (the CPU GEMM's setup)
        if getattr(m, "quant_method", None) is not None:
            m.quant_method.process_weights_after_loading(m)
    return cp.eval(), int(cfg["hidden_size"] if tiny else cfg.hidden_size), dtype


def measure(frame: Any, device: str, args: argparse.Namespace) -> tuple[dict[str, Any], torch.Tensor]:
    """One mode at one R: eager and graph-replay ms per frame, and the kernels of a frame."""
    eager_codes = frame()[0].clone()
    res: dict[str, Any] = {"eager_ms": timed(frame, args.frames)}
    msg = f"  eager {res['eager_ms']:.2f} ms"
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        frame()
        sync()
        with torch.cuda.graph(graph):
            out = frame()
        res["graph_ms"] = timed(graph.replay, args.frames)
        graph.replay()
        sync()
        res["graph_equals_eager"] = bool(torch.equal(out[0], eager_codes))
        msg += f", graph replay {res['graph_ms']:.3f} ms, graph == eager: {res['graph_equals_eager']}"
    res["kernels"] = kernels(frame, args.top, say)
    say(msg)
    return res, eager_codes


def layer_errors(cp: Any, r: int, hidden: int, device: str) -> dict[str, float]:
    """Per mode: layer 0 of the code predictor over a frame's first call (positions 0, 1 of R
    rows) and the next (position 2, reading the cache the first wrote), in the model's dtype,
    against the same layer in float32 with the native kernels: the largest absolute error of
    what the layer adds to its input (attention and MLP: the input's own rounding would mask
    them), relative to the reference's largest value, over both calls. A kernel that normed,
    rotated or cached the wrong thing is off by O(1); rounding only, by about the dtype's
    epsilon."""
    from omni_mp.models.qwen3_omni.vllm_hooks_talker import CP_POSITIONS, EagerKernels

    layer, rope = cp.model.layers[0], cp.rope
    gen = torch.Generator(device=device).manual_seed(1000 + r)
    # Inputs at the scale of the layer's increment (the input norm makes it see the same
    # thing): at unit scale, rounding the residual sum in bf16 would hide the increment.
    first = 0.01 * torch.randn(2 * r, hidden, generator=gen, device=device)
    second = 0.01 * torch.randn(r, hidden, generator=gen, device=device)
    pos_first = torch.tensor([0, 1] * r, device=device)
    pos_second = torch.full((r,), 2, device=device)
    cache_shape = (r, 2, layer.kv_heads, CP_POSITIONS, layer.head_dim)

    def run(lay: Any, rope: Any, mode: str, dtype: torch.dtype) -> torch.Tensor:
        kernels = EagerKernels(mode)  # type: ignore[arg-type]
        cache = torch.zeros(cache_shape, dtype=dtype, device=device)
        outs = []
        with kernels.scope():
            for x, pos, t0 in ((first, pos_first, 0), (second, pos_second, 2)):
                xin = x.to(dtype)  # the layer's fused add + norm updates its input in place: pass a copy
                outs.append(sum(lay(xin.clone(), None, pos, rope, kernels, cache, t0)).float() - xin.float())
        return torch.cat(outs)

    # The reference: the same weights (and rope table) cast to float32 in place, then back
    # (bf16 -> fp32 -> bf16 is exact; vLLM's parameters do not deep-copy).
    dtype = next(layer.parameters()).dtype
    layer.float(), rope.float()
    want = run(layer, rope, "native", torch.float32)
    layer.to(dtype), rope.to(dtype)
    modes = MODES if device == "cuda" else MODES[:1]  # vLLM's CUDA kernels only there
    return {m: float((run(layer, rope, m, dtype) - want).abs().max() / want.abs().max()) for m in modes}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,8,32,64", help="comma-separated request counts per call")
    p.add_argument("--frames", type=int, default=50, help="timed calls per measurement")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--tiny", action="store_true", help="the tiny checkpoint's code predictor, on the CPU")
    p.add_argument("--out", type=Path, default=Path("qwen3_code_predictor_profile.json"))
    args = p.parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    from vllm.config import set_current_vllm_config

    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": {}}
    ok = True
    with set_current_vllm_config(vllm_config()), torch.inference_mode():
        one_rank_groups(device)
        cp, hidden, dtype = build(args.tiny, device)
        for r in [int(x) for x in args.rows.split(",")]:
            gen = torch.Generator(device=device).manual_seed(r)
            h_prev = torch.randn(r, hidden, generator=gen, device=device).to(dtype)
            e0 = torch.randn(r, hidden, generator=gen, device=device).to(dtype)
            greedy = torch.zeros(r, dtype=torch.bool, device=device)
            row: dict[str, Any] = {}
            codes: dict[str, torch.Tensor] = {}
            for mode in MODES:
                cp.kernel_mode = mode
                say(f"R={r} {mode}")
                row[mode], codes[mode] = measure(lambda: cp(h_prev, e0, greedy), device, args)  # noqa: B023
                ok &= row[mode].get("graph_equals_eager", True)
            row["layer_error"] = errs = layer_errors(cp, r, hidden, device)
            say(f"R={r}: layer 0 vs float32, relative error " + ", ".join(f"{m} {e:.2e}" for m, e in errs.items()))
            # The fused kernel rounds once where the separate ones round three times.
            if device == "cuda":
                ok &= errs["fused"] <= 1.5 * max(errs["ops"], errs["native"]) + 1e-6
            else:
                ok &= errs["native"] < 1e-5
            for mode in MODES[1:]:
                row[f"codes_agree_{mode}"] = agree = float((codes["native"] == codes[mode]).float().mean())
                say(f"R={r}: {mode} shares {agree:.3f} of native's codes")
            if device == "cuda":
                ms = {m: row[m]["graph_ms"] for m in MODES}
                say(f"R={r}: graph ms per frame " + ", ".join(f"{m} {v:.3f}" for m, v in ms.items()))
            results["rows"][str(r)] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    say(f"wrote {args.out}; {'OK' if ok else 'FAILED (see above)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

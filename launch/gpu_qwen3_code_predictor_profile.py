"""What one talker frame's code predictor costs on one GPU (issue 22): the Qwen3-Omni talker's
15-step code predictor (`omni_mp.models.qwen3_omni.vllm_hooks_talker.CodePredictor`) at the
released sizes (5 layers, hidden 1024, 16 heads / 8 KV heads of 128, intermediate 3072, 2048
codes; random bf16 weights), built in memory under the vLLM config a talker stage gets (torch
compile on, so vLLM switches its custom ops off and sets RMSNorm's IR priority to `native`, as
the worker does), for R rows (= requests in a decode step) with greedy decoding:

- `default`: the layers' vLLM dispatch as it is in the stage (native torch forms of RMSNorm,
  rotary embedding and SiluAndMul, since the code predictor runs outside the compiled region);
- `fused`: `EagerKernels` (vLLM's CUDA kernels for those ops), what the talker runs.

Per mode and R: ms per frame replayed from a CUDA graph (how the talker's FULL graph runs
it) and eager, and the CUDA kernels of one frame (torch.profiler). Both modes decode the same
inputs: the script prints how many of the R x 15 codes agree (bf16 kernels may round
differently, and a flip changes what follows) and exits 1 if the fused mode's graph replay
gives other codes than its eager run.

    python3 launch/gpu_qwen3_code_predictor_profile.py [--rows 1,8,32,64] [--out FILE]
    python3 launch/gpu_qwen3_code_predictor_profile.py --tiny --rows 1,2   # CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.gpu_qwen_image_step_profile import kernels, sync, timed  # noqa: E402

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 64}  # fmt: skip


def say(msg: str) -> None:
    print(f"[cp_profile] {msg}", flush=True)


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
    res["kernels"] = kernels(frame, args.top)
    say(msg)
    return res, eager_codes


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
            for mode in ("default", "fused"):
                cp.fused_kernels = mode == "fused"
                say(f"R={r} {mode}")
                row[mode], codes[mode] = measure(lambda: cp(h_prev, e0, greedy), device, args)  # noqa: B023
                ok &= mode != "fused" or row[mode].get("graph_equals_eager", True)
            agree = float((codes["default"] == codes["fused"]).float().mean())
            row["codes_agree"] = agree
            say(f"R={r}: codes agree {agree:.3f}")
            results["rows"][str(r)] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    say(f"wrote {args.out}; {'OK' if ok else 'FUSED GRAPH != EAGER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Warm-up of vLLM 0.25.0's fused-MoE and sampler Triton kernels before an AR stage serves
(pinned to 0.25.0: the kernel choice below mirrors `fused_moe.py`, `moe_align_block_size.py`
and `topk_topp_sampler.py`).

Why: vLLM picks the fused-MoE kernel's tile config from the step's token count M (a tuned
table per GPU, nearest key, or `get_default_config`'s thresholds), and Triton compiles one
variant per config and per specialization of its integer arguments (divisible by 16, equal
to 1: `num_valid_tokens` = M x top_k and `EM`, the padded sorted-ids length). vLLM's own
start-up runs M = `max_num_batched_tokens` (the memory profile) and the CUDA graph sizes
(capture); every other M of a prefill chunk that selects a variant not seen yet compiles it
inside a request's step. Measured on an H200 (Qwen3-Omni at the released sizes, 2500-token
prompt, one request): the talker's second prefill chunk (492 tokens, tuned key 512) took
1198 ms against 76 ms for its 2051-token first chunk, 1.2 s of that request's 1.58 s to first
audio; the thinker stalled 1082 ms on a 728-token step the same way.

So: group every M from the largest captured graph size + 1 (1 when eager) to
`max_num_batched_tokens` by the variant it selects, and run the model once (vLLM's own
`_dummy_run`, as its warm-up does for compile sizes) at the smallest M of each group. A group
key splits at least as finely as Triton does, so no variant is missed; a key finer than needed
only costs one more dummy forward (~tens of ms with the kernels compiled).

The sampler's top-k / top-p Triton kernel (`apply_top_k_top_p_triton`, which vLLM 0.25.0's
`apply_top_k_top_p` runs on CUDA from 8 rows on) is compiled per variant too: per filter
(top-k alone, top-p alone, both: constexprs) and per specialization of BATCH_SIZE. vLLM's own
warm-up (`_dummy_sampler_run`) runs both filters at `max_num_seqs` rows only. Measured on an
H200 (Qwen3-TTS 1.7B served, requests sampling with top-k 50 and no top-p): the talker's first
steps of 8 and of 48 requests took 1577 and 1426 ms against 9 ms p50, a stall every request
in flight heard. `warm_up_sampler_worker` runs every variant once at start-up.

Both run after vLLM's own warm-up, when its JIT monitor (`vllm.utils.jit_monitor`) already
counts every Triton compile as a serving stall (a warning; an error under `jit_monitor_mode:
error`, which tests/gpu/test_sampler_warmup.py serves with): its hook is off while they run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import msgspec


class MoeShape(msgspec.Struct, frozen=True):
    """What selects a fused-MoE layer's kernel config, besides M."""

    w13: tuple[int, ...]  # [E, 2N, K]
    w2: tuple[int, ...]  # [E, K, N]
    top_k: int
    dtype_name: str | None  # the quant config's name for the tuned-config file (None: unquantized)
    block_shape: tuple[int, ...] | None


class MoeWarmup(msgspec.Struct, frozen=True):
    """What one worker did: the token counts it ran and the seconds it took."""

    sizes: list[int]
    seconds: float
    layers: int  # fused-MoE layer shapes found (distinct)


@contextlib.contextmanager
def start_up_compiles() -> Iterator[None]:
    """Triton compiles here are start-up, not serving: vLLM's JIT monitor hook is off meanwhile."""
    try:
        from triton import knobs
    except ImportError:  # no Triton: nothing compiles, nothing to hide
        yield
        return
    hook = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = None
    try:
        yield
    finally:
        knobs.runtime.jit_post_compile_hook = hook


def triton_int_key(v: int) -> Hashable:
    """How Triton specializes an integer kernel argument (its own function: type by range,
    divisible by 16, 1 as a constant)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    kind, key = native_specialize_impl(BaseBackend, v, False, True, True)
    return kind, key


def variant_key(config: dict[str, Any], m: int, shape: MoeShape) -> Hashable:
    """The Triton variant a step of `m` tokens runs (at least as fine as Triton's own key):
    the tile config and the specialization classes of num_valid_tokens and EM."""
    experts = shape.w2[0]
    block_m = int(config["BLOCK_SIZE_M"])
    valid = m * shape.top_k
    em = valid + experts * (block_m - 1)  # moe_align_block_size's sorted-ids length
    if valid < experts:
        em = min(valid * block_m, em)
    if m < block_m:  # invoke_fused_moe_triton_kernel bounds EM for small batches
        em = min(em, valid * block_m)
    rounded = -(-em // block_m) * block_m  # with pad_sorted_ids
    return (
        tuple(sorted(config.items())),
        triton_int_key(valid),
        triton_int_key(em),
        triton_int_key(rounded),
    )


def plan_sizes(config_of: Callable[[int], dict[str, Any]], shape: MoeShape, lo: int, hi: int) -> list[int]:
    """The smallest M in [lo, hi] of each kernel variant (see `variant_key`)."""
    seen: dict[Hashable, int] = {}
    for m in range(max(lo, 1), hi + 1):
        seen.setdefault(variant_key(config_of(m), m, shape), m)
    return sorted(seen.values())


def vllm_config_of(shape: MoeShape) -> Callable[[int], dict[str, Any]]:
    """vLLM's own choice of tile config for M tokens (the tuned table of this GPU, if any)."""
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

    block = list(shape.block_shape) if shape.block_shape is not None else None
    return lambda m: try_get_optimal_moe_config(shape.w13, shape.w2, shape.top_k, shape.dtype_name, m, block)


def moe_shapes(model: Any, dtype: Any) -> list[MoeShape]:
    """The distinct fused-MoE layer shapes of a loaded vLLM model."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    shapes: set[MoeShape] = set()
    for module in model.modules():
        if not isinstance(module, RoutedExperts):
            continue
        w13, w2 = getattr(module, "w13_weight", None), getattr(module, "w2_weight", None)
        if w13 is None or w2 is None or w13.dim() != 3 or w2.dim() != 3:
            continue
        qc = getattr(module.quant_method, "moe_quant_config", None)
        block = getattr(qc, "block_shape", None) if qc is not None else None
        shapes.add(
            MoeShape(
                w13=tuple(w13.shape),
                w2=tuple(w2.shape),
                top_k=int(module.top_k),
                dtype_name=qc.config_name(dtype) if qc is not None else None,
                block_shape=tuple(block) if block is not None else None,
            )
        )
    return sorted(shapes, key=repr)


def warm_up_worker(worker: Any) -> MoeWarmup:
    """In the worker (collective_rpc): plan and run the dummy forwards."""
    runner = worker.model_runner
    vllm_config = runner.vllm_config
    shapes = moe_shapes(runner.get_model(), vllm_config.model_config.dtype)
    if not shapes:
        return MoeWarmup(sizes=[], seconds=0.0, layers=0)
    comp = vllm_config.compilation_config
    graphs = not vllm_config.model_config.enforce_eager and bool(comp.cudagraph_capture_sizes)
    lo = (int(comp.max_cudagraph_capture_size or 0) + 1) if graphs else 1
    hi = int(vllm_config.scheduler_config.max_num_batched_tokens)
    sizes = sorted({m for s in shapes for m in plan_sizes(vllm_config_of(s), s, lo, hi)})
    t0 = time.perf_counter()
    with start_up_compiles():
        for m in sizes:
            runner._dummy_run(m, skip_eplb=True, remove_lora=False)
    if hasattr(worker, "device") and getattr(worker.device, "type", "") == "cuda":
        import torch

        torch.cuda.synchronize()
    return MoeWarmup(sizes=sizes, seconds=time.perf_counter() - t0, layers=len(shapes))


# vLLM 0.25.0 `apply_top_k_top_p`: on CUDA, batches of this many rows or more run the Triton kernel
TRITON_SAMPLER_MIN_ROWS = 8


class SamplerWarmup(msgspec.Struct, frozen=True):
    """What one worker did for the sampler: the batch sizes it ran each filter at, and how long."""

    batches: list[int]
    seconds: float


def sampler_batches(lo: int, hi: int) -> list[int]:
    """The smallest batch size in [lo, hi] of each Triton specialization of BATCH_SIZE."""
    seen: dict[Hashable, int] = {}
    for b in range(max(lo, 1), hi + 1):
        seen.setdefault(triton_int_key(b), b)
    return sorted(seen.values())


def warm_up_sampler_worker(worker: Any) -> SamplerWarmup:
    """In the worker (collective_rpc): each filter of `apply_top_k_top_p` on logits as the
    sampler gets them (the model's own `compute_logits` of zero hidden states, in float32 as
    `Sampler.forward` makes them) at each batch size of `sampler_batches`."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    runner = worker.model_runner
    cfg = runner.vllm_config
    if cfg.device_config.device.type != "cuda":
        return SamplerWarmup(batches=[], seconds=0.0)
    batches = sampler_batches(TRITON_SAMPLER_MIN_ROWS, int(cfg.scheduler_config.max_num_seqs))
    model, dev = runner.get_model(), runner.device
    width, dtype = cfg.model_config.get_hidden_size(), cfg.model_config.dtype
    hidden = torch.zeros(max(batches, default=1), width, dtype=dtype, device=dev)
    t0 = time.perf_counter()
    with torch.inference_mode(), start_up_compiles():
        for b in batches:
            logits = model.compute_logits(hidden[:b])
            vocab = logits.shape[-1]
            k = torch.full((b,), min(50, vocab - 1), dtype=torch.int32, device=dev)
            p = torch.full((b,), 0.9, dtype=torch.float32, device=dev)
            for top_k, top_p in ((k, None), (None, p), (k, p)):
                apply_top_k_top_p(logits.to(torch.float32), top_k, top_p)
        torch.cuda.synchronize()
    return SamplerWarmup(batches=batches, seconds=time.perf_counter() - t0)


def warm_up_sampler_kernels(core: Any) -> SamplerWarmup:
    """Run `warm_up_sampler_worker` on the engine's (first) worker; every worker does the same."""
    return core.model_executor.collective_rpc(warm_up_sampler_worker)[0]


def warm_up_moe_kernels(core: Any) -> MoeWarmup:
    """Run `warm_up_worker` on the engine's (first) worker; every worker does the same."""
    results = core.model_executor.collective_rpc(warm_up_worker)
    return results[0]

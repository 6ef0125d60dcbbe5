"""The fused-MoE warm-up plan (omni_mp.engines.vllm_hooks_warmup) against vLLM 0.25.0's own
kernel-config choice and Triton's own integer specialization, on the tuned H200 tables vLLM
ships for the released Qwen3-Omni thinker (E=128, N=768, top-8) and talker (E=128, N=384,
top-6). No GPU is needed: both choices are host-side functions.

What must hold: every token count a step can have (past the largest CUDA graph size up to the
scheduler's budget) selects a kernel variant that one planned size has already compiled, and
the plan stays a handful of forwards. The stage-level behaviour (warm-up forwards, then exact
serving) is in tests/test_qwen3_omni_pipeline.py, whose YAML turns the warm-up on on CPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from vllm.model_executor.layers import fused_moe

from omni_mp.engines.vllm_hooks_warmup import MoeShape, plan_sizes

CONFIGS = Path(fused_moe.__file__).parent / "configs"
# (E, K, N, top_k) of the released Qwen3-Omni-30B-A3B's MoE layers
THINKER = (128, 2048, 768, 8)
TALKER = (128, 1024, 384, 6)
LO, HI = 129, 8192  # past a 128-token graph, up to an 8192-token budget


def h200_table(e: int, n: int) -> Callable[[int], dict[str, Any]]:
    """vLLM's lookup in its tuned table: the config of the nearest key (try_get_optimal_moe_config)."""
    path = CONFIGS / f"E={e},N={n},device_name=NVIDIA_H200.json"
    table = {int(k): v for k, v in json.loads(path.read_text()).items()}
    return lambda m: table[min(table, key=lambda k: abs(k - m))]


def triton_key(v: int) -> Any:
    return native_specialize_impl(BaseBackend, v, False, True, True)


@pytest.mark.parametrize("layer", [THINKER, TALKER], ids=["thinker", "talker"])
def test_every_step_size_reuses_a_planned_variant(layer: tuple[int, int, int, int]) -> None:
    e, k, n, top_k = layer
    config_of = h200_table(e, n)
    shape = MoeShape(w13=(e, 2 * n, k), w2=(e, k, n), top_k=top_k, dtype_name=None, block_shape=None)
    sizes = plan_sizes(config_of, shape, LO, HI)
    assert LO in sizes and all(LO <= m <= HI for m in sizes)
    configs = {json.dumps(config_of(m), sort_keys=True) for m in range(LO, HI + 1)}
    # Each config comes in at most a few Triton specializations of M x top_k: not one forward per size.
    assert len(configs) <= len(sizes) <= 4 * len(configs)

    def variant(m: int) -> tuple[str, Any]:
        return json.dumps(config_of(m), sort_keys=True), triton_key(m * top_k)

    compiled = {variant(p) for p in sizes}
    missed = [m for m in range(LO, HI + 1) if variant(m) not in compiled]
    assert not missed, f"token counts whose kernel variant no planned size compiles: {missed[:10]}"


def test_the_recorded_stalls_are_planned() -> None:
    """The H200 record (docs/results/qwen3_omni/qwen3_omni_gpu_h200.md): the talker stalled 1.2 s on a
    492-token chunk, the thinker 1.1 s on a 728-token step, while 2048-token chunks (the
    memory profile's size) did not. Their variants are warmed now, and differ from 2048's."""
    for (e, k, n, top_k), m in [(TALKER, 492), (THINKER, 728)]:
        config_of = h200_table(e, n)
        shape = MoeShape(w13=(e, 2 * n, k), w2=(e, k, n), top_k=top_k, dtype_name=None, block_shape=None)
        sizes = plan_sizes(config_of, shape, LO, HI)
        assert config_of(m) != config_of(2048)
        assert any(config_of(p) == config_of(m) and triton_key(p * top_k) == triton_key(m * top_k) for p in sizes)


def test_an_eager_stage_plans_from_one_token() -> None:
    """Without CUDA graphs every batch size runs the kernels itself: 1 is a Triton constant."""
    e, k, n, top_k = TALKER
    shape = MoeShape(w13=(e, 2 * n, k), w2=(e, k, n), top_k=top_k, dtype_name=None, block_shape=None)
    sizes = plan_sizes(h200_table(e, n), shape, 1, 2048)
    assert sizes[0] == 1 and triton_key(1)[0] == "constexpr"


def test_every_sampler_batch_reuses_a_warmed_variant() -> None:
    """The sampler's Triton kernel (vLLM 0.25.0: from TRITON_SAMPLER_MIN_ROWS rows on CUDA) is
    specialized on BATCH_SIZE by Triton's own rule: every batch a step can have must share its
    specialization with a warmed one, and warming stays a few batches, not one per size. The
    stalls the H200 run recorded (first steps of 8 and of 48 requests) are both covered."""
    from vllm.v1.sample.ops import topk_topp_sampler

    from omni_mp.engines.vllm_hooks_warmup import TRITON_SAMPLER_MIN_ROWS, sampler_batches

    source = Path(topk_topp_sampler.__file__).read_text()
    assert f"logits.shape[0] >= {TRITON_SAMPLER_MIN_ROWS}" in source  # the pinned switch to Triton
    for hi in (8, 16, 64, 256):
        warmed = sampler_batches(TRITON_SAMPLER_MIN_ROWS, hi)
        assert warmed and all(TRITON_SAMPLER_MIN_ROWS <= b <= hi for b in warmed)
        assert len({triton_key(b) for b in warmed}) == len(warmed) <= 4
        keys = {triton_key(b) for b in warmed}
        assert all(triton_key(b) in keys for b in range(TRITON_SAMPLER_MIN_ROWS, hi + 1))
    assert triton_key(8) != triton_key(48)  # two variants: the recorded stalls were two compiles

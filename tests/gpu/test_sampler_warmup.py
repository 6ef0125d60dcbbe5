"""No Triton kernel compiles while an AR stage serves sampled requests (the sampler warm-up,
omni_mp.engines.vllm_hooks_warmup): one tiny AR stage with CUDA graphs, served with vLLM's JIT
monitor in `jit_monitor_mode: error`, under which a kernel compiled during a step raises in the
worker and fails the step's requests. Bursts of sampled requests whose batch sizes cover both of
Triton's specializations of the sampler kernel's BATCH_SIZE (8 and 9 rows, 16 and 48: where vLLM
0.25.0 switches to its Triton top-k / top-p kernel, and a multiple of 16 below max_num_seqs),
with each filter (top-k alone, top-p alone, both): every request must finish with its tokens.
Without the warm-up, vLLM's own start-up compiles only both filters at max_num_seqs rows, and the
first top-k-only burst of 8 fails (on an H200 serving Qwen3-TTS it stalled 1.6 s instead)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

TOKENS = 6
BURSTS = (8, 9, 16, 48)
FILTERS = {"top_k": {"top_k": 20}, "top_p": {"top_p": 0.9}, "both": {"top_k": 20, "top_p": 0.9}}


def _config() -> Any:
    from omni_mp.config.validate import parse_config

    engine = {
        "dtype": "bfloat16",
        "max_model_len": 256,
        "max_num_seqs": 64,
        "kv_cache_memory_bytes": 1 << 30,
        "jit_monitor_mode": "error",
    }
    stage = {
        "id": 0,
        "model": "tiny-qwen2",
        "devices": [0],
        "final_output": True,
        "engine_args": engine,
        "sampling": {"max_tokens": TOKENS, "ignore_eos": True, "temperature": 1.0},
    }
    return parse_config({"name": "sampler_warmup_check", "stages": [stage]})


async def _bursts() -> list[str]:
    """Each filter at each burst size; what failed or came back short."""
    from omni_mp.client.omni_client import AsyncOmniClient
    from omni_mp.control.embedded import embedded_pipeline
    from omni_mp.wire.messages import SamplingParamsMsg

    problems: list[str] = []
    with embedded_pipeline(_config(), progress=lambda m: print(f"  {m}", flush=True)) as coord:
        async with AsyncOmniClient(coord.client_endpoint) as client:
            for name, knobs in FILTERS.items():
                for n in BURSTS:
                    sampling = {0: SamplingParamsMsg(max_tokens=TOKENS, ignore_eos=True, temperature=1.0, **knobs)}
                    sends = [client.generate(f"request {i}", sampling=sampling, deadline_s=300) for i in range(n)]
                    done = await asyncio.gather(*sends, return_exceptions=True)
                    for i, d in enumerate(done):
                        if isinstance(d, BaseException):
                            problems.append(f"{name} x{n} request {i}: {type(d).__name__}: {d}"[:300])
                        elif len(d.outputs[0].token_ids) != TOKENS:
                            problems.append(f"{name} x{n} request {i}: {len(d.outputs[0].token_ids)} tokens")
                    print(f"  {name} burst of {n}: {sum(not isinstance(d, BaseException) for d in done)}/{n} done")
    return problems


def test_sampled_bursts_compile_nothing(report: Callable[[dict[str, Any]], Path]) -> None:
    problems = asyncio.run(_bursts())
    report({"bursts": list(BURSTS), "filters": list(FILTERS), "problems": problems})
    assert not problems, "\n".join(problems[:10])

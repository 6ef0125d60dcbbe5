"""A GPU stage's own memory against its budget (`stages[i].memory`): capped while it runs, and
checked once it has started.

The coordinator sizes each budget before any stage starts (omni_mp.control.memory_budget):
weights, the KV cache that is left, and an estimate of the rest. What the estimate cannot see
(CUDA graph pools at every captured size, kernel workspaces at the step budget) shows only once
the engine has started. A stage over its budget leaves less than planned to the stages beside
it, and one of them then fails with CUDA out-of-memory in the middle of serving. Seen on one
H200: with `max_num_batched_tokens: 8192` and 64 sequences, Qwen3-Omni's thinker and talker
used 4.5 and 5.5 GiB more than their budgets, and code2wav died of out-of-memory at its first
64-window step. Most of that came after start-up, while serving (the talker: 12.5 GiB once
started, 18.2 after the rounds), in blocks PyTorch keeps cached once used. So:
- before its engine starts, a stage caps PyTorch's allocations on each of its GPUs at its budget
  less a CUDA context (`torch.cuda.set_per_process_memory_fraction`): at the cap PyTorch first
  frees its unused cached blocks and retries, and only a stage whose live tensors exceed its
  own budget fails, itself, instead of a neighbour;
- once started, it measures its process's memory by the driver's count (PyTorch's and the
  rest: CUDA context, library workspaces) and refuses to serve when over, naming the numbers.
"""

from __future__ import annotations

import os

from omni_mp.config.schema import StageConfig
from omni_mp.utils.devices import caller_devices
from omni_mp.utils.gpu_memory import CUDA_CONTEXT_BYTES, GiB, MemoryBudgetError, nvml_indices, process_gpu_bytes


def cap_gpu_memory(stage: StageConfig) -> str | None:
    """Cap PyTorch's allocations on each GPU this process sees at the stage's budget less one
    CUDA context (outside PyTorch's count); a note of the cap, or None (no budget, no GPU)."""
    if stage.memory is None or not stage.devices:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    allowed = max(int(stage.memory.gpu_gib * GiB) - CUDA_CONTEXT_BYTES, GiB // 4)
    for i in range(torch.cuda.device_count()):
        total = torch.cuda.get_device_properties(i).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total), i)
    return f"PyTorch capped at {allowed / GiB:.2f} GiB a GPU"


def _sizing_knob(stage: StageConfig) -> str:
    """The setting that sizes the stage's activations, with its value."""
    if stage.kind == "diffusion":
        return f"diffusion.max_batch {stage.diffusion.max_batch}"
    return f"max_num_batched_tokens {stage.engine_args.get('max_num_batched_tokens', 'default')}"


def _remedy(stage: StageConfig) -> str:
    """What follows "Raise memory.reserve_gib" for a stage over its budget."""
    if stage.kind == "diffusion":
        return ", raise memory.gpu_gib, or lower diffusion.max_batch"
    return " (it comes out of the KV cache), raise memory.gpu_gib, or lower max_num_batched_tokens or max_num_seqs"


def out_of_budget(stage: StageConfig, err: BaseException) -> MemoryBudgetError:
    """The error of a stage that ran out of its budget while starting (`err`: PyTorch's)."""
    assert stage.memory is not None
    first = ". ".join(str(err).split(". ")[:2])  # "CUDA out of memory. Tried to allocate N MiB"
    return MemoryBudgetError(
        f"stage {stage.id}: ran out of its GPU memory budget while starting (memory.gpu_gib "
        f"{stage.memory.gpu_gib:g}, reserve_gib {stage.memory.reserve_gib:g}): {first}. "
        f"Raise memory.reserve_gib{_remedy(stage)}"
    )


def torch_gpu_bytes(devices: list[int]) -> dict[int, int]:
    """The fallback measure: PyTorch's reserved memory per visible device (its cached blocks
    and CUDA graph pools; not the CUDA context, which the budget's reserve covers)."""
    import torch

    return {d: int(torch.cuda.memory_reserved(i)) for i, d in enumerate(devices)}


def check_gpu_memory(stage: StageConfig, used: dict[int, int] | None = None) -> str | None:
    """MemoryBudgetError if the stage uses more than its budget on any of its GPUs; else a
    note of what it uses (None: no budget, a CPU stage, or no GPU to measure). `used`: device
    -> bytes, measured here when None."""
    if stage.memory is None or not stage.devices:
        return None
    source = "driver"
    if used is None:
        import torch

        if not torch.cuda.is_available():
            return None
        # This process sees its GPUs as CUDA_VISIBLE_DEVICES lists them (set by the
        # coordinator: the caller's entries for `devices`); NVML numbers them its own way.
        indices = nvml_indices(caller_devices(os.environ) or [str(d) for d in stage.devices])
        used = None if indices is None else process_gpu_bytes(os.getpid(), indices)
        if used is None:
            used, source = torch_gpu_bytes(stage.devices), "PyTorch reserved"
    budget = int(stage.memory.gpu_gib * GiB)
    over = {d: n for d, n in used.items() if n > budget}
    if over:
        worst = max(over.values()) - budget
        where = ", ".join(f"{n / GiB:.2f} GiB on GPU {d}" for d, n in sorted(over.items()))
        raise MemoryBudgetError(
            f"stage {stage.id}: started, but uses {where} ({source}), over its budget memory.gpu_gib "
            f"{stage.memory.gpu_gib:g}: what the plan did not count (CUDA graphs, kernel workspaces at "
            f"{_sizing_knob(stage)}) would be taken from the stages sharing its GPU. Raise memory.reserve_gib by "
            f"at least {worst / GiB:.1f}{_remedy(stage)}"
        )
    return "; ".join(f"GPU {d}: {n / GiB:.2f} of {budget / GiB:.2f} GiB ({source})" for d, n in sorted(used.items()))

"""Per-stage GPU memory budgets (`stages[i].memory`), checked before any stage starts.

1. Per device: the budgets of the stages pinned to it must fit in its free memory, read
   without creating a CUDA context in the coordinator (NVML, else `nvidia-smi`). With no
   NVIDIA driver (a CPU-only host) or stages on Ray nodes, this check is skipped and logged.
2. Per stage: the budget must hold the weights (from the safetensors headers of the part's dir,
   the checkpoint's or a sub-model's in it: the family's `part_dir`; for `load_format: dummy` /
   no weights, the parameter count of the HF model built on the `meta` device), plus a minimum
   KV cache (one `max_model_len` request, what vLLM itself requires) and an activation estimate
   (AR) or `max_batch` trajectories' activations (diffusion), plus the stage's fixed `reserve_gib`.
3. AR stages get `kv_cache_memory_bytes` = budget - weights - activations - reserve. vLLM
   0.25.0 then skips its own profiling-based sizing, but its start-up check still wants
   `gpu_memory_utilization` x total free when the worker starts; that is set to the stage's
   share (budget less one CUDA context, over the total), which holds whatever order stages
   sharing a device start in, since their budgets fit together.
Every violation is reported at once, each with its numbers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from omni_mp.config.schema import PipelineConfig, StageConfig
from omni_mp.models.family import CheckpointSizing
from omni_mp.models.registry import checkpoint_sizing
from omni_mp.utils.devices import DeviceError, nvml_index, visible_entries
from omni_mp.utils.gpu_memory import CUDA_CONTEXT_BYTES, GiB, MemoryBudgetError, nvml

log = logging.getLogger("omni_mp.control.memory_budget")

BLOCK_TOKENS = 16  # vLLM's default KV block size: the minimum KV cache rounds up to it
DEFAULT_BATCHED_TOKENS = 8192  # vLLM's max_num_batched_tokens default for the offline engine
DEFAULT_MAX_SEQS = 256
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "F8_E4M3": 1, "F8_E5M2": 1}


class GpuProcess(msgspec.Struct, frozen=True):
    """A process holding memory on a GPU, as NVML lists it."""

    pid: int
    name: str
    used_bytes: int | None  # None: the driver does not say (some containers, MIG)


class DeviceMemory(msgspec.Struct, frozen=True):
    index: int  # NVML's
    total_bytes: int
    free_bytes: int  # now, when queried
    uuid: str = ""
    holders: list[GpuProcess] = []  # who holds what is not free (empty: none, or not known)


class StageNeeds(msgspec.Struct, frozen=True):
    """What one stage needs on each of its devices, besides its KV cache beyond the minimum."""

    weight_bytes: int
    weight_source: str  # where the weight estimate came from
    min_kv_bytes: int  # one max_model_len request (AR); 0 for diffusion
    activation_bytes: int  # one max_num_batched_tokens forward (AR); max_batch trajectories (diffusion)


class StagePlan(msgspec.Struct, frozen=True):
    stage_id: int
    devices: list[int]  # as the stage names them (indices into the caller's visible GPUs)
    budget_bytes: int
    reserve_bytes: int
    needs: StageNeeds
    kv_cache_bytes: int | None  # AR stages: what vLLM gets as kv_cache_memory_bytes
    gpu_memory_utilization: float | None  # AR stages with a known device total
    replica: int = 0
    gpus: list[int] = []  # NVML's indices of `devices` (empty: not known)

    @property
    def name(self) -> str:
        return f"stage {self.stage_id}" + (f" replica {self.replica}" if self.replica else "")


class MemoryPlan(msgspec.Struct, frozen=True):
    stages: list[StagePlan]
    devices: dict[int, DeviceMemory] | None  # None: not known (no NVIDIA driver, or Ray)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


# ---- devices --------------------------------------------------------------------------------
class NvmlReader(Protocol):
    """What the memory check reads of the GPUs (NVML; a stand-in in tests of the logic)."""

    def count(self) -> int: ...
    def memory(self, index: int) -> tuple[int, int, str]: ...  # total bytes, free bytes, uuid
    def processes(self, index: int) -> list[GpuProcess]: ...


class PynvmlReader:
    """NVML through its Python bindings (omni_mp.utils.gpu_memory.nvml)."""

    def __init__(self, pynvml: Any) -> None:
        self.nvml = pynvml

    def count(self) -> int:
        return int(self.nvml.nvmlDeviceGetCount())

    def memory(self, index: int) -> tuple[int, int, str]:
        handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        uuid = self.nvml.nvmlDeviceGetUUID(handle)
        return int(info.total), int(info.free), uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def processes(self, index: int) -> list[GpuProcess]:
        handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        procs = list(self.nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        procs += list(self.nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
        return [GpuProcess(p.pid, _process_name(p.pid), p.usedGpuMemory) for p in procs]


def _process_name(pid: int) -> str:
    """A process's command line, shortened ("?" when it is not visible from here)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in args[:4] if a)[:120] or "?"


def read_devices(reader: NvmlReader) -> dict[int, DeviceMemory]:
    """Every GPU's total and free memory now, and the processes holding it."""
    out = {}
    for i in range(reader.count()):
        total, free, uuid = reader.memory(i)
        out[i] = DeviceMemory(i, total, free, uuid, reader.processes(i))
    return out


def query_devices() -> dict[int, DeviceMemory] | None:
    """Total and free memory of every NVIDIA GPU of this host now, and who holds it, without
    a CUDA context; None when there is no driver. Indices are NVML's (PCI order); CUDA's
    default order can differ on hosts with mixed GPU models (set CUDA_DEVICE_ORDER=PCI_BUS_ID there)."""
    with nvml() as pynvml:
        if pynvml is not None:
            return read_devices(PynvmlReader(pynvml))
    smi = shutil.which("nvidia-smi")  # no NVML, or it failed (logged)
    if smi is None:
        return None
    try:
        res = subprocess.run(
            [smi, "--query-gpu=index,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:
        log.info("nvidia-smi failed (%s)", err)
        return None
    return parse_nvidia_smi(res.stdout)


def parse_nvidia_smi(text: str) -> dict[int, DeviceMemory]:
    """`index, total MiB, free MiB` lines -> devices."""
    out = {}
    for line in text.strip().splitlines():
        idx, total, free = (int(x.strip()) for x in line.split(","))
        out[idx] = DeviceMemory(idx, total * 2**20, free * 2**20)
    return out


# ---- what a stage needs -----------------------------------------------------------------------
def _dtype_bytes(stage: StageConfig, hf_dtype: str | None) -> int:
    if stage.kind == "diffusion":
        return 4  # the diffusion engine runs fp32 (omni_mp.engines.diffusion.engine)
    name = str(stage.engine_args.get("dtype", "auto"))
    if name == "auto":
        name = (hf_dtype or "bfloat16").replace("torch.", "")
        name = "bfloat16" if name == "float32" else name  # vLLM's "auto" serves fp32 checkpoints in bf16 on GPUs
    try:
        return _DTYPE_BYTES[name]
    except KeyError:
        raise MemoryBudgetError(f"stage {stage.id}: cannot size dtype {name!r}") from None


def _sizing(model_dir: Path) -> tuple[dict[str, Any], CheckpointSizing | None]:
    """The checkpoint's config.json, and its family's sizing (None: a plain causal LM)."""
    config = json.loads((model_dir / "config.json").read_text())
    return config, checkpoint_sizing(config.get("model_type", ""))


def _part_prefixes(part: str) -> tuple[str, ...]:
    return () if part == "all" else (f"{part}.",)


def safetensors_params(model_dir: Path, part: str, skip: set[str] = frozenset()) -> int | None:  # type: ignore[assignment]
    """Parameter count of `part` from the safetensors headers (8-byte length + JSON), or None
    when the dir has no safetensors or none of the part's tensors."""
    files = sorted(model_dir.glob("*.safetensors"))
    prefixes = _part_prefixes(part)
    total, found = 0, False
    for path in files:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, meta in header.items():
            if key == "__metadata__" or (prefixes and not key.startswith(prefixes)):
                continue
            inner = key[len(prefixes[0]) :] if prefixes else key
            if any(inner.startswith(s) for s in skip):
                continue
            numel = 1
            for d in meta["shape"]:
                numel *= d
            total += numel
            found = True
    return total if found else None


def meta_params(model_dir: Path, part: str, skip: set[str] = frozenset()) -> int:  # type: ignore[assignment]
    """Parameter count of `part` from its config alone: the HF model built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    _, sizing = _sizing(model_dir)
    with torch.device("meta"):
        if part == "all" or sizing is None:
            model = AutoModelForCausalLM.from_config(config)
        else:
            cls, sub = sizing.meta_model(config, part)
            model = cls._from_config(sub)
    return sum(p.numel() for name, p in model.named_parameters() if not any(name.startswith(s) for s in skip))


def estimate_needs(stage: StageConfig, model_dir: Path) -> StageNeeds:
    config, sizing = _sizing(model_dir)
    if sizing is None and stage.kind == "diffusion":
        raise MemoryBudgetError(
            f"stage {stage.id}: no model family sizes checkpoints of model_type {config.get('model_type')!r}"
        )
    part = "all" if sizing is None else sizing.part(stage)
    skip = set() if sizing is None else sizing.skipped(stage, part)
    hf_dtype = config.get("dtype") or config.get("torch_dtype")
    width = _dtype_bytes(stage, hf_dtype)
    part_dir = model_dir if sizing is None else sizing.part_dir(model_dir, part)
    params = None
    if stage.engine_args.get("load_format", "auto") != "dummy":
        params = safetensors_params(part_dir, part, skip)
        where = "" if part_dir == model_dir else f" in {part_dir.relative_to(model_dir)}/"
        source = f"safetensors headers ({part}{where})"
    if params is None:
        try:
            params = meta_params(model_dir, part, skip)
        except ValueError as err:  # e.g. a model_type transformers has no class for (Qwen3-TTS)
            raise MemoryBudgetError(
                f"stage {stage.id}: cannot size {part!r} of model_type {config.get('model_type')!r} "
                f"without its safetensors (load_format: dummy, or no weight files in {part_dir}): "
                f"transformers cannot build it from its config ({str(err).split('. ')[0]})"
            ) from err
        source = f"parameter count of the config ({part}, meta device)"
    weights = params * width
    if sizing is not None and stage.kind == "diffusion":
        if part_dir != model_dir:
            config = json.loads((part_dir / "config.json").read_text())
        return StageNeeds(weights, source, 0, sizing.diffusion_activations(stage, config))
    text = config.get("text_config", config) if sizing is None else sizing.text_config(config, part)
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    kv_heads = text.get("num_key_value_heads") or heads
    per_token = 2 * text["num_hidden_layers"] * kv_heads * head_dim * width
    max_len = int(stage.engine_args.get("max_model_len") or text.get("max_position_embeddings", 32768))
    min_kv = per_token * (-(-max_len // BLOCK_TOKENS) * BLOCK_TOKENS)
    tokens = int(stage.engine_args.get("max_num_batched_tokens") or max(DEFAULT_BATCHED_TOKENS, max_len))
    seqs = int(stage.engine_args.get("max_num_seqs") or DEFAULT_MAX_SEQS)
    # One prefill chunk's peak: the MLP's gate/up output plus a few hidden-width buffers, and
    # the sampler's fp32 logits and probabilities for every sequence.
    act = tokens * (2 * text["intermediate_size"] + 6 * text["hidden_size"]) * width
    act += seqs * text["vocab_size"] * 4 * 2
    return StageNeeds(weights, source, min_kv, act)


# ---- the plan ---------------------------------------------------------------------------------
def plan_memory(
    cfg: PipelineConfig,
    devices: dict[int, DeviceMemory] | None,
    *,
    needs: Callable[[StageConfig], StageNeeds] | None = None,
    env: Mapping[str, str] | None = None,
) -> MemoryPlan:
    """Check every budget of `cfg`, each replica's, against `devices` (None: device totals
    unknown, that check is skipped) and the stages' needs; raise MemoryBudgetError naming
    every problem. `env`: the caller's environment (its CUDA_VISIBLE_DEVICES; default: ours)."""
    from omni_mp.models.registry import resolve_model

    estimate = needs or (lambda s: estimate_needs(s, Path(resolve_model(s.model))))
    env = os.environ if env is None else env
    problems: list[str] = []
    plans: list[StagePlan] = []
    known: dict[int, StageNeeds] = {}  # one estimate per stage, whatever its replicas
    for r, s in cfg.replica_stages():
        if s.memory is None:
            continue
        if s.id not in known:
            known[s.id] = estimate(s)
        n = known[s.id]
        budget, reserve = int(s.memory.gpu_gib * GiB), int(s.memory.reserve_gib * GiB)
        # Tensor parallel stages hold 1/len(devices) of the weights on each device.
        weights = n.weight_bytes // max(1, len(s.devices))
        need = weights + n.min_kv_bytes + n.activation_bytes + reserve
        what = "min KV cache (one max_model_len request)" if s.kind == "ar" else "no KV cache"
        if budget < need and r == 0:  # the same for every replica: said once
            problems.append(
                f"stage {s.id}: memory.gpu_gib {s.memory.gpu_gib:g} ({_gib(budget)}) < {_gib(need)} needed = "
                f"weights {_gib(weights)} [{n.weight_source}] + {what} {_gib(n.min_kv_bytes)} + "
                f"activations {_gib(n.activation_bytes)} + reserve {_gib(reserve)}"
            )
        gpus = _nvml_gpus(s, r, devices, env, problems)
        kv = budget - weights - n.activation_bytes - reserve if s.kind == "ar" else None
        util = None
        if s.kind == "ar" and devices is not None and gpus and all(d in devices for d in gpus):
            total = min(devices[d].total_bytes for d in gpus)
            util = round(max(budget - CUDA_CONTEXT_BYTES, GiB // 4) / total, 4)
        plans.append(StagePlan(s.id, list(s.devices), budget, reserve, n, kv, util, r, gpus))
    if devices is not None:
        problems += _device_problems(plans, devices)
    if problems:
        raise MemoryBudgetError("GPU memory budgets do not fit:\n  " + "\n  ".join(problems))
    return MemoryPlan(plans, devices)


def _nvml_gpus(
    s: StageConfig, replica: int, devices: dict[int, DeviceMemory] | None, env: Mapping[str, str], problems: list[str]
) -> list[int]:
    """NVML's indices of a replica's `devices`, read through the caller's CUDA_VISIBLE_DEVICES;
    a device it does not see is a problem (empty result)."""
    who = f"stage {s.id}" + (f" replica {replica}" if replica else "")
    try:
        entries = visible_entries(s.devices, env, who)
    except DeviceError as err:
        problems.append(str(err))
        return []
    uuids = {} if devices is None else {d.uuid: i for i, d in devices.items() if d.uuid}
    found = [nvml_index(e, uuids.get) for e in entries]
    if any(i is None for i in found):
        if devices is not None:
            problems.append(f"{who}: GPU {entries} not found on this host (its GPUs: {sorted(devices)})")
        return []
    return [i for i in found if i is not None]


def _holders(dev: DeviceMemory) -> str:
    if not dev.holders:
        return ""
    parts = [
        f"pid {p.pid} ({p.name}){'' if p.used_bytes is None else ' ' + _gib(p.used_bytes)}"
        for p in sorted(dev.holders, key=lambda p: -(p.used_bytes or 0))[:8]
    ]
    more = len(dev.holders) - len(parts)
    return "; held by " + ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def _device_problems(plans: list[StagePlan], devices: dict[int, DeviceMemory]) -> list[str]:
    problems = []
    on: dict[int, list[StagePlan]] = {}
    for p in plans:
        for d in p.gpus:
            on.setdefault(d, []).append(p)
    for d, ps in sorted(on.items()):
        if d not in devices:
            problems.append(f"device {d}: not found (this host has GPUs {sorted(devices)})")
            continue
        dev, used = devices[d], sum(p.budget_bytes for p in ps)
        if used > dev.free_bytes:
            parts = " + ".join(f"{p.name} {_gib(p.budget_bytes)}" for p in ps)
            problems.append(
                f"device {d}: budgets {parts} = {_gib(used)} > {_gib(dev.free_bytes)} free now "
                f"(of {_gib(dev.total_bytes)} total{_holders(dev)}): lower memory.gpu_gib, use fewer "
                "replicas on this GPU, or free it"
            )
    return problems


def apply_memory_plan(cfg: PipelineConfig, plan: MemoryPlan) -> PipelineConfig:
    """`cfg` with each AR stage's budget turned into vLLM engine args (one set for all its
    replicas: the smallest device's utilization share)."""
    by_id: dict[int, list[StagePlan]] = {}
    for p in plan.stages:
        by_id.setdefault(p.stage_id, []).append(p)
    stages = []
    for s in cfg.stages:
        ps = by_id.get(s.id, [])
        if ps and ps[0].kv_cache_bytes is not None:
            args = {**s.engine_args, "kv_cache_memory_bytes": ps[0].kv_cache_bytes}
            utils = [p.gpu_memory_utilization for p in ps if p.gpu_memory_utilization is not None]
            if utils:
                args["gpu_memory_utilization"] = max(utils)
            s = msgspec.structs.replace(s, engine_args=args)
        stages.append(s)
    return msgspec.structs.replace(cfg, stages=stages)


def resolve_memory_budgets(
    cfg: PipelineConfig,
    *,
    progress: Callable[[str], None] | None = None,
    devices: dict[int, DeviceMemory] | None | str = "query",
) -> PipelineConfig:
    """The coordinator's entry: `cfg` unchanged when no stage has a budget; else checked
    (MemoryBudgetError) and with the budgets applied. `devices="query"`: ask this host."""
    say = progress or (lambda m: log.info("%s", m))
    if not any(s.memory is not None for s in cfg.stages):
        return cfg
    if devices == "query":
        if cfg.placement.kind == "ray":
            devices = None
            say("memory budgets: stages run on Ray nodes; device totals not checked here")
        else:
            devices = query_devices()
            if devices is None:
                say("memory budgets: no NVIDIA driver on this host; device totals not checked")
    assert not isinstance(devices, str)
    plan = plan_memory(cfg, devices)
    for p in plan.stages:
        kv = "" if p.kv_cache_bytes is None else f", KV cache {_gib(p.kv_cache_bytes)}"
        say(
            f"{p.name}: budget {_gib(p.budget_bytes)} on GPU {p.devices}: weights "
            f"{_gib(p.needs.weight_bytes)}, activations {_gib(p.needs.activation_bytes)}{kv}"
        )
    return apply_memory_plan(cfg, plan)

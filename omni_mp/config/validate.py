"""Pipeline YAML -> typed, validated config (the types: `omni_mp.config.schema`).

Unknown keys are rejected and every error names the key path (``stages[1].engine_args.foo``).
Graph checks: unique stage ids, known inputs, no cycles; processors, prompt formats, model
parts and diffusion model types are names from the model registry (omni_mp.models.registry:
a YAML file never names a module to import). Validation reads the families' declarations only
(names and processor traits): it imports no family code and no torch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec
import yaml

from omni_mp.config.schema import ConfigError, PipelineConfig, StageConfig, parse_core_list
from omni_mp.engines.diffusion.params import DiffusionStageConfig
from omni_mp.models import registry
from omni_mp.wire.messages import MAX_PROCESSES


def _msgspec_path(err: msgspec.ValidationError) -> str:
    # msgspec says "... - at `$.stages[1].engine_args`"; turn `$.x` into `x`.
    return str(err).replace("`$.", "`").replace("`$`", "`<root>`")


@functools.cache
def _engine_arg_names() -> frozenset[str]:
    from omni_mp.engines.vllm_hooks_engine_args import engine_arg_names  # (read without importing vLLM)

    return engine_arg_names()


# vLLM's own weight loaders (a plugin-registered load_format could run any code); `dummy`
# (random weights) is what benchmarks at real sizes use.
BUILTIN_LOAD_FORMATS = frozenset({"auto", "pt", "safetensors", "npcache", "dummy", "fastsafetensors"})
# Set by omni_mp from the stage config itself; writing them in engine_args would be ambiguous.
_RESERVED_ENGINE_ARGS = {"model"}
# engine_args through which vLLM imports or runs code named in the YAML (class paths,
# plugins, remote model code, connector modules), or reads files / reaches hosts the YAML
# names. Refused unless `security.allow_code_import: true`.
IMPORT_CAPABLE_ENGINE_ARGS = frozenset(
    {
        "trust_remote_code", "scheduler_cls", "worker_cls", "worker_extension_cls", "logits_processors",
        "distributed_executor_backend", "io_processor_plugin", "reasoning_parser_plugin", "model_class_overrides",
        "hf_overrides", "compilation_config", "kv_transfer_config", "ec_transfer_config", "kv_events_config",
        "speculative_config", "spec_model", "model_loader_extra_config", "load_format", "additional_config",
        "tokenizer_mode", "code_revision", "allowed_local_media_path", "otlp_traces_endpoint", "profiler_config",
        "weight_transfer_config", "structured_outputs_config", "kv_offloading_backend", "offload_backend",
    }
)  # fmt: skip

# `compilation_config` keys that only size or switch vLLM's CUDA graphs: they name no backend,
# pass, op or path, so a YAML may set them without the opt-in (e.g. graphs for prefill steps).
GRAPH_ONLY_COMPILATION_KEYS = frozenset({"cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mode"})


def _runs_no_code(key: str, value: Any) -> bool:
    """An import-capable engine arg whose value here imports and runs nothing."""
    if key == "load_format":
        return value in BUILTIN_LOAD_FORMATS
    if key == "compilation_config":
        return isinstance(value, dict) and set(value) <= GRAPH_ONLY_COMPILATION_KEYS
    return False


# Set by the diffusion engine (omni_mp.engines.diffusion.engine): its scheduler, worker, fp32...
_DIFFUSION_ENGINE_ARGS = {
    "scheduler_cls",
    "worker_cls",
    "skip_tokenizer_init",
    "async_scheduling",
    "additional_config",
    "hf_overrides",
    "distributed_executor_backend",
    "dtype",
    "enable_prefix_caching",
    "mm_processor_cache_gb",
}


def _check_kind(s: StageConfig, where: str) -> None:
    """What a diffusion stage cannot have, and what only a diffusion stage can have."""
    known = registry.names("processors")
    proc = registry.processor_traits(s.processor) if s.processor in known else None
    if s.kind != "diffusion":
        if s.diffusion != DiffusionStageConfig():
            raise ConfigError(f"`{where}.diffusion`: only for `kind: diffusion` stages")
        if proc is not None and proc.feeds_diffusion:
            raise ConfigError(f"`{where}.processor`: {s.processor!r} feeds a diffusion stage, not an AR one")
        if s.engine_args.get("mm_processor_cache_gb", 0) != 0:
            # Requests are prepared on another thread than the one that adds them (stage.prepare);
            # vLLM's cache assumes the engine receives every processed item in processing order.
            raise ConfigError(
                f"`{where}.engine_args.mm_processor_cache_gb`: must stay 0 (omni_mp prepares media off the engine "
                "thread, and a request that fails in between would leave vLLM's processor cache out of step)"
            )
        return
    if s.hidden_states is not None or s.prompt_embeds:
        raise ConfigError(f"`{where}`: a diffusion stage has no hidden states or prompt embeddings")
    if s.warm_moe_kernels is not None:
        raise ConfigError(f"`{where}.warm_moe_kernels`: only for AR stages (the diffusion engine runs no fused MoE)")
    if proc is not None and not proc.feeds_diffusion:
        diffusion = [k for k in known if registry.processor_traits(k).feeds_diffusion]
        raise ConfigError(
            f"`{where}.processor`: {s.processor!r} does not feed a diffusion stage; use one of {diffusion}"
        )
    _check_name("diffusion_models", s.diffusion.model_type, f"{where}.diffusion.model_type")
    for key in s.engine_args:
        if key in _DIFFUSION_ENGINE_ARGS:
            raise ConfigError(f"`{where}.engine_args.{key}`: set by the diffusion engine")


def _check_name(kind: registry.Kind, name: str, where: str) -> None:
    """`name` must be one the model registry knows (the error lists the known ones)."""
    try:
        registry.check(kind, name)
    except registry.RegistryError as err:
        raise ConfigError(f"`{where}`: {err}") from None


# Set from `memory` (omni_mp.control.memory_budget); writing them as well would be ambiguous.
BUDGET_ENGINE_ARGS = ("kv_cache_memory_bytes", "gpu_memory_utilization")


def _check_replicas(s: StageConfig, where: str, placement: str) -> None:
    """`replica_devices` / `replica_ray_resources`: one entry per replica, instead of the
    stage-wide key; every replica on GPUs or none, with one tensor-parallel size."""
    if s.replica_devices:
        if s.devices:
            raise ConfigError(f"`{where}.replica_devices`: give `devices` (every replica's) or this, not both")
        if len(s.replica_devices) != s.replicas:
            raise ConfigError(
                f"`{where}.replica_devices`: {len(s.replica_devices)} device lists for `replicas: {s.replicas}`; "
                "give one list per replica"
            )
        sizes = {len(d) for d in s.replica_devices}
        if 0 in sizes or len(sizes) > 1:
            raise ConfigError(
                f"`{where}.replica_devices`: every replica needs the same number of GPUs (>= 1), "
                f"got {s.replica_devices}"
            )
        for r, devs in enumerate(s.replica_devices):
            if any(d < 0 for d in devs) or len(set(devs)) != len(devs):
                raise ConfigError(f"`{where}.replica_devices[{r}]`: GPU ids must be distinct and >= 0, got {devs}")
    if s.replica_ray_resources:
        if placement != "ray":
            raise ConfigError(f"`{where}.replica_ray_resources`: only with `placement.kind: ray`")
        if s.ray_resources:
            raise ConfigError(f"`{where}.replica_ray_resources`: give `ray_resources` or this, not both")
        if len(s.replica_ray_resources) != s.replicas:
            raise ConfigError(
                f"`{where}.replica_ray_resources`: {len(s.replica_ray_resources)} entries for "
                f"`replicas: {s.replicas}`; give one per replica"
            )


def _check_memory(s: StageConfig, where: str) -> None:
    if not s.devices:
        raise ConfigError(f"`{where}.memory`: a GPU budget needs `devices`; CPU stages use `cpu_kv_cache_gib`")
    for key in BUDGET_ENGINE_ARGS:
        if key in s.engine_args:
            raise ConfigError(f"`{where}.engine_args.{key}`: set from `{where}.memory`; write one or the other")


def _check_entry_and_part(s: StageConfig, where: str) -> None:
    """What only entry stages (or only stages with inputs) take, and the model part."""
    if s.prompt_embeds and s.inputs:
        raise ConfigError(f"`{where}.prompt_embeds`: only for entry stages (its processor decides otherwise)")
    if s.prompt_format is not None and (s.inputs or s.kind != "ar"):
        raise ConfigError(f"`{where}.prompt_format`: only for entry AR stages (they take the client's prompt)")
    if s.wait_for_upstream and not s.inputs:
        raise ConfigError(f"`{where}.wait_for_upstream`: only for stages with inputs")
    if s.prompt_format is not None:
        _check_name("prompt_formats", s.prompt_format, f"{where}.prompt_format")
    if s.model_part is not None and s.kind != "ar":
        raise ConfigError(f"`{where}.model_part`: only for AR stages")
    if s.model_part is not None:
        _check_name("model_parts", s.model_part, f"{where}.model_part")


def _check_inputs(cfg: PipelineConfig, s: StageConfig, where: str) -> None:
    """A stage's inputs exist, and its processor is known and gets what it needs from them."""
    ids = [st.id for st in cfg.stages]
    for j, up in enumerate(s.inputs):
        if up not in ids:
            raise ConfigError(f"`{where}.inputs[{j}]`: unknown stage id {up} (stages: {ids})")
        if up == s.id:
            raise ConfigError(f"`{where}.inputs[{j}]`: stage {s.id} cannot be its own input")
    if s.inputs and s.processor is None:
        known = registry.names("processors")
        raise ConfigError(f"`{where}.processor`: required for a stage with inputs; known: {known}")
    if s.processor is None:
        return
    if not s.inputs:
        raise ConfigError(f"`{where}.processor`: an entry stage (no inputs) takes the prompt, not a processor")
    _check_name("processors", s.processor, f"{where}.processor")
    if registry.processor_traits(s.processor).needs_hidden_states:
        for j, up in enumerate(s.inputs):
            if cfg.stages[ids.index(up)].hidden_states is None:
                raise ConfigError(
                    f"`{where}.inputs[{j}]`: processor {s.processor!r} needs hidden states from stage {up}; "
                    f"set `hidden_states: {{}}` there"
                )


def validate(cfg: PipelineConfig, *, check_engine_args: bool = True) -> PipelineConfig:
    ids = [s.id for s in cfg.stages]
    if not cfg.stages:
        raise ConfigError("`stages`: a pipeline needs at least one stage")
    for i, s in enumerate(cfg.stages):
        where = f"stages[{i}]"
        if s.id < 0:
            raise ConfigError(f"`{where}.id`: must be >= 0, got {s.id}")
        if s.id in ids[:i]:
            raise ConfigError(f"`{where}.id`: stage id {s.id} is already used by stages[{ids.index(s.id)}]")
        _check_kind(s, where)
        _check_inputs(cfg, s, where)
        _check_entry_and_part(s, where)
        if s.hidden_states is not None and any(k < 0 for k in s.hidden_states.layers):
            raise ConfigError(f"`{where}.hidden_states.layers`: layer indices must be >= 0")
        if any(d < 0 for d in s.devices) or len(set(s.devices)) != len(s.devices):
            raise ConfigError(f"`{where}.devices`: GPU ids must be distinct and >= 0, got {s.devices}")
        _check_replicas(s, where, cfg.placement.kind)
        s = s.replica(0)  # the device checks below hold for every replica alike
        if s.memory is not None:
            _check_memory(s, where)
        if s.mps_priority != "normal" and not s.devices:
            raise ConfigError(f"`{where}.mps_priority`: a GPU stage's MPS client priority; this stage has no `devices`")
        if s.mps_sm_percent is not None and not s.devices:
            raise ConfigError(f"`{where}.mps_sm_percent`: an MPS share of a GPU; this stage has no `devices`")
        if s.cpu_kv_cache_gib < 1:
            raise ConfigError(f"`{where}.cpu_kv_cache_gib`: must be >= 1, got {s.cpu_kv_cache_gib}")
        if s.cpu_cores is not None:
            try:
                parse_core_list(s.cpu_cores)
            except ValueError:
                raise ConfigError(
                    f"`{where}.cpu_cores`: expected a core list like '0-3' or '0,2', got {s.cpu_cores!r}"
                ) from None
        for key in s.engine_args:
            safe = _runs_no_code(key, s.engine_args[key])
            if key in IMPORT_CAPABLE_ENGINE_ARGS and not safe and not cfg.security.allow_code_import:
                raise ConfigError(
                    f"`{where}.engine_args.{key}`: lets vLLM import or run code named in the YAML; refused unless "
                    "`security.allow_code_import: true` (only for YAML you trust as much as code)"
                )
        if check_engine_args:
            for key in s.engine_args:
                if key in _RESERVED_ENGINE_ARGS:
                    raise ConfigError(f"`{where}.engine_args.{key}`: set by omni_mp; use `{where}.{key}`")
                if key not in _engine_arg_names():
                    raise ConfigError(f"`{where}.engine_args.{key}`: not an argument of vLLM 0.25.0's EngineArgs")
    _check_acyclic(cfg)
    processes = sum(s.replicas for s in cfg.stages)
    if processes > MAX_PROCESSES:
        raise ConfigError(f"`stages`: {processes} stage processes (replicas counted); at most {MAX_PROCESSES}")
    if cfg.placement.kind == "ray" and cfg.endpoints.transport != "tcp":
        raise ConfigError("`endpoints.transport`: placement 'ray' puts stages on other hosts; use 'tcp' (with keys)")
    if cfg.placement.kind == "ray" and cfg.gpu_sharing.mode == "mps":
        raise ConfigError(
            "`gpu_sharing.mode`: 'mps' starts an MPS daemon on this host; with placement 'ray' stages run on "
            "other hosts (run MPS there, or use 'auto')"
        )
    if cfg.placement.kind != "ray" and any(s.ray_resources for s in cfg.stages):
        where = next(i for i, s in enumerate(cfg.stages) if s.ray_resources)
        raise ConfigError(f"`stages[{where}].ray_resources`: only with `placement.kind: ray`")
    if cfg.endpoints.transport == "tcp" and cfg.security.keys is None:
        raise ConfigError(
            "`security.keys`: tcp endpoints need CURVE keys: create them with `omni-mp keys DIR --client NAME` "
            "and set `security: {keys: DIR}` here"
        )
    if cfg.security.keys is not None:
        from omni_mp.wire.keys import KeyFileError, pipeline_identity

        try:
            pipeline_identity(cfg.security.keys)
        except KeyFileError as err:
            raise ConfigError(f"`security.keys`: {err}") from None
    if not cfg.entry_stages:
        raise ConfigError("`stages`: no entry stage (every stage has inputs)")
    if not cfg.final_stages:
        raise ConfigError("`stages`: no stage has `final_output: true`")
    return cfg


def check_models(cfg: PipelineConfig) -> None:
    """Every stage's `model` is a built-in name or a checkpoint dir on this host (placement
    local; Ray nodes hold their own). Cheap: checked before anything imports vLLM or starts."""
    if cfg.placement.kind != "local":
        return
    for i, s in enumerate(cfg.stages):
        try:
            registry.check_model(s.model)
        except registry.RegistryError as err:
            raise ConfigError(f"`stages[{i}].model`: {err}") from None


def _check_acyclic(cfg: PipelineConfig) -> None:
    inputs = {s.id: s.inputs for s in cfg.stages}
    state: dict[int, int] = {}  # 1 = on the DFS path, 2 = done

    def visit(node: int, path: list[int]) -> None:
        if state.get(node) == 2:
            return
        if state.get(node) == 1:
            cycle = path[path.index(node) :] + [node]
            raise ConfigError(f"`stages`: the inputs form a cycle: {' -> '.join(map(str, cycle))}")
        state[node] = 1
        for up in inputs[node]:
            visit(up, path + [node])
        state[node] = 2

    for sid in inputs:
        visit(sid, [])


def parse_config(data: Any, *, check_engine_args: bool = True) -> PipelineConfig:
    try:
        cfg = msgspec.convert(data, PipelineConfig)
    except msgspec.ValidationError as err:
        raise ConfigError(_msgspec_path(err)) from None
    return validate(cfg, check_engine_args=check_engine_args)


def load_config(path: str | Path, *, check_engine_args: bool = True) -> PipelineConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    security = data.get("security") if isinstance(data, dict) else None
    keys = security.get("keys") if isinstance(security, dict) else None
    if isinstance(keys, str) and not Path(keys).is_absolute():  # relative to the YAML file, not the cwd
        data["security"]["keys"] = str((path.parent / keys).resolve())
    try:
        return parse_config(data, check_engine_args=check_engine_args)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None

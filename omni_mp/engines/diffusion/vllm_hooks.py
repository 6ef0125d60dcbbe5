"""The one place the diffusion kind touches vLLM 0.25.0 internals: a scheduler (`scheduler_cls`)
and a worker (`worker_cls`) that vLLM's own `EngineCore` runs, in the stage process.

EngineCore hosts them unchanged: its executor builds our worker (`worker_cls` by qualified
name), asks it for KV-cache specs (none: a DiT keeps its per-request state in the worker,
no paged cache, so EngineCore takes its attention-free path and allocates nothing), then
each `EngineCore.step()` is `schedule()` -> `execute_model()` -> `update_from_output()`,
exactly as for an AR model. Requests enter through `EngineCore.add_request` and leave
through `abort_requests`; outputs come back as `EngineCoreOutput`s whose `pooling_output`
is the step's audio (float32 samples). The policy lives in `diffusion.batcher` (scheduler
side) and `diffusion.runner` (worker side), which import nothing from vLLM.

The engine's settings travel in `VllmConfig.additional_config["omni_mp_diffusion"]` (vLLM's
field for extension settings), as a `DiffusionStageConfig` converted to builtins.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import torch

from omni_mp.engines.diffusion.batcher import Batcher, DiffusionRequest, StepPlan, StepResult
from omni_mp.engines.diffusion.chunking import check_streaming
from omni_mp.engines.diffusion.graphs import GraphSet, GraphWarmup
from omni_mp.engines.diffusion.params import DiffusionStageConfig
from omni_mp.engines.diffusion.runner import DiffusionRunner
from omni_mp.engines.vllm_hooks import CoreDriver

log = logging.getLogger("omni_mp.diffusion")

CONFIG_KEY = "omni_mp_diffusion"
WORKER_CLS = "omni_mp.engines.diffusion.vllm_hooks.DiffusionWorker"


def stage_config(vllm_config: Any) -> DiffusionStageConfig:
    return msgspec.convert(vllm_config.additional_config[CONFIG_KEY], DiffusionStageConfig)


def load_model(model_dir: str, cfg: DiffusionStageConfig, device: torch.device) -> Any:
    """The DiffusionModel named by `cfg.model_type` (a model family's, from the registry)."""
    from omni_mp.models.registry import diffusion_model

    return diffusion_model(cfg.model_type, model_dir, device, cfg.model_options)


def use_kernel_settings(cfg: DiffusionStageConfig) -> None:
    """The stage's kernel choices, process-wide: its float32 matmul precision and whether SDPA
    may use cuDNN's attention. The worker sets them before loading the model (nothing in
    vLLM's init of this worker resets them), so before anything runs on the device: a CUDA
    graph keeps the kernels it was captured with (graphs captured at start-up under "highest"
    made a "high" stage 2-4x slower per step on an H200)."""
    torch.set_float32_matmul_precision(cfg.float32_matmul)
    # cuDNN convolutions follow the same setting: PyTorch lets them use TF32 by default
    # (`cudnn.allow_tf32` is True), which made exact-fp32 vocoder output depend on how a
    # stream was chunked (1.2% relative L2 between two runs of Qwen3-Omni's code2wav on an H200).
    torch.backends.cudnn.allow_tf32 = cfg.float32_matmul == "high"
    # vLLM 0.25.0's CUDA platform module calls `enable_cudnn_sdp(False)` when it is imported
    # (vllm/platforms/cuda.py); a diffusion stage's modules are diffusers' and transformers',
    # which run with PyTorch's default (on): `cudnn_attention` in DiffusionStageConfig.
    torch.backends.cuda.enable_cudnn_sdp(cfg.cudnn_attention)


def _base_classes() -> tuple[type, type]:
    from vllm.v1.core.sched.interface import SchedulerInterface
    from vllm.v1.worker.worker_base import WorkerBase

    return SchedulerInterface, WorkerBase


_SchedulerBase, _WorkerBase = _base_classes()


class DiffusionScheduler(_SchedulerBase):  # type: ignore[misc, valid-type]
    """vLLM's scheduler interface over `Batcher`."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any, **kwargs: Any) -> None:
        from vllm.v1.core.sched.interface import PauseState

        cfg = stage_config(vllm_config)
        self.batcher = Batcher(cfg.max_batch, cfg.streaming)
        self.connector = None  # EngineCore reads it: no KV transfer
        self._pause = PauseState.UNPAUSED

    # the calls EngineCore makes every step
    def add_request(self, request: DiffusionRequest) -> None:  # type: ignore[override]
        self.batcher.add(request)

    def schedule(self, throttle_prefills: bool = False) -> StepPlan:  # type: ignore[override]
        return self.batcher.schedule()

    def get_grammar_bitmask(self, scheduler_output: Any) -> None:
        return None

    def update_from_output(self, scheduler_output: Any, model_runner_output: StepResult) -> dict[int, Any]:  # type: ignore[override]
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

        outputs = []
        for rid, samples, finished, error in self.batcher.update(model_runner_output):
            reason = None if not finished else FinishReason.ERROR if error else FinishReason.STOP
            outputs.append(
                EngineCoreOutput(
                    request_id=rid, new_token_ids=[], pooling_output=samples, finish_reason=reason, stop_reason=error
                )
            )
        return {0: EngineCoreOutputs(outputs=outputs)} if outputs else {}

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[tuple[str, int]]:  # type: ignore[override]
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        known = [rid for rid in ids if rid in self.batcher.requests]
        self.batcher.finish(known)
        return [(rid, 0) for rid in known]

    def get_num_unfinished_requests(self) -> int:
        return self.batcher.num_unfinished()

    def has_finished_requests(self) -> bool:
        return bool(self.batcher.freed)

    # the rest of the interface: nothing to do for a cache-less model
    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        return None

    def update_draft_token_ids_in_output(self, draft_token_ids: Any, scheduler_output: Any) -> None:
        return None

    @property
    def pause_state(self) -> Any:
        return self._pause

    def set_pause_state(self, pause_state: Any) -> None:
        self._pause = pause_state

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return True

    def reset_encoder_cache(self) -> None:
        return None

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.batcher.running), len(self.batcher.waiting)

    def make_stats(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


class DiffusionWorker(_WorkerBase):  # type: ignore[misc, valid-type]
    """vLLM's worker interface over `DiffusionRunner`; loads the model in `load_model`."""

    def init_device(self) -> None:
        if torch.cuda.is_available() and self.device_config.device_type == "cuda":
            self.device = torch.device(f"cuda:{self.local_rank}")
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        cfg = stage_config(self.vllm_config)
        assert self.device is not None
        self.graph_warmup: GraphWarmup | None = None
        self.graph_warmup_error: str | None = None
        use_kernel_settings(cfg)
        model = load_model(self.model_config.model, cfg, self.device)
        crossfade = check_streaming(cfg.streaming, model.window_align, model.samples_per_input, model.sample_rate)
        graphs = None
        if cfg.cuda_graphs and self.device.type == "cuda":
            graphs = GraphSet(cfg.max_graphs)
        self.model_runner = DiffusionRunner(  # type: ignore[assignment]
            model, crossfade, graphs, cfg.graph_batch_sizes, cfg.graph_max_frames, cfg.restart_step_before
        )

    def get_model(self) -> Any:
        return self.model_runner.model  # type: ignore[union-attr]

    def get_kv_cache_spec(self) -> dict[str, Any]:
        return {}  # no paged KV cache: EngineCore's attention-free path

    def determine_available_memory(self) -> int:
        return 0

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        return None

    def compile_or_warm_up_model(self) -> Any:
        from vllm.v1.worker.worker_base import CompilationTimes

        cfg = stage_config(self.vllm_config)
        runner: DiffusionRunner = self.model_runner  # type: ignore[assignment]
        speaker = cfg.defaults.speaker or cfg.default_speaker
        defaults = msgspec.structs.replace(cfg.defaults, seed=0, speaker=speaker)  # the dummy windows' params
        if cfg.warm_up_graphs and runner.graphs is not None:  # graphs: cuda_graphs on a CUDA device
            # Best-effort: a failure leaves every shape to be captured on first use, as without it.
            try:
                self.graph_warmup = runner.warm_up_graphs(cfg.streaming, cfg.max_batch, defaults)
            except Exception as err:  # noqa: BLE001 - the stage serves without it
                log.exception("CUDA graph warm-up failed; graphs will be captured on first use")
                self.graph_warmup_error = f"{type(err).__name__}: {err}"[:300]
        elif cfg.warm_up_graphs and hasattr(runner.model, "warm_up_compiled"):
            runner.model.warm_up_compiled(defaults)  # no graphs: compile now, not in a request's step
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def get_graph_warmup(self) -> tuple[GraphWarmup | None, str | None]:
        return self.graph_warmup, self.graph_warmup_error

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ()

    def execute_model(self, scheduler_output: StepPlan) -> StepResult:  # type: ignore[override]
        return self.model_runner.execute(scheduler_output)  # type: ignore[union-attr]

    def shutdown(self) -> None:
        self.model_runner = None


class DiffusionCoreDriver(CoreDriver):
    """The diffusion engine's view of its `EngineCore`: our scheduler's batcher and the
    worker's model (both in this process)."""

    @property
    def batcher(self) -> Batcher:
        return self.core.scheduler.batcher

    def add(self, request: Any) -> None:
        """Our scheduler takes our request type as it is (no vLLM `Request` is made of it)."""
        self.core.add_request(request)

    def model(self) -> Any:
        return self.core.collective_rpc("get_model")[0]

    def graph_warmup(self) -> tuple[GraphWarmup | None, str | None]:
        """What the worker's start-up CUDA graph capture did, or its error."""
        return self.core.collective_rpc("get_graph_warmup")[0]

    def can_step(self) -> bool:
        """A step would advance something (not only requests waiting for upstream ids)."""
        return self.batcher.runnable()

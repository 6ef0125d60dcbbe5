"""A diffusion stage engine: vLLM 0.25.0's `EngineCore`, in the stage process, running omni_mp's
diffusion scheduler and worker (`omni_mp.engines.vllm_hooks_diffusion`).

The stage loop drives it like the AR engine: add requests (their input ids may keep
arriving: `add_inputs`), `step()` while `can_step()`, abort. Each step advances every running
trajectory by one solver step; a step's outputs are audio chunks (float32 samples at
`sample_rate`), the last one of a request marked finished.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from omni_mp.engines.diffusion.model import DiffusionInputError
from omni_mp.engines.diffusion.params import DiffusionParams, DiffusionStageConfig


class DiffusionEngineInputError(ValueError):
    """A request's input was rejected (the message says what and why)."""


@dataclass(frozen=True, slots=True)
class AudioStepOutput:
    request_id: str
    audio: torch.Tensor | None  # float32 [samples]: this step's new audio of the request
    finished: bool
    finish_reason: str | None  # "stop" | "error"
    error: str | None = None


class DiffusionEngine:
    def __init__(self, model: str, cfg: DiffusionStageConfig, engine_args: dict[str, Any] | None = None) -> None:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor import Executor

        from omni_mp.engines.vllm_hooks_diffusion import CONFIG_KEY, WORKER_CLS, DiffusionScheduler

        self.cfg = cfg
        # The worker runs in this process (vLLM's CPU platform would otherwise swap "uni" for "mp").
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        args = dict(engine_args or {})
        args.update(
            skip_tokenizer_init=True,  # inputs are codec ids, not text
            scheduler_cls=DiffusionScheduler,
            worker_cls=WORKER_CLS,
            async_scheduling=False,  # a step's outputs decide the next step's admissions
            enable_prefix_caching=False,
            distributed_executor_backend="uni",  # the worker runs in this process, one step at a time
            dtype="float32",  # what the worker runs (transformers runs token2wav in fp32 too)
            mm_processor_cache_gb=0,  # no multimodal inputs reach a diffusion stage
            # vLLM never builds the checkpoint's architecture here (our worker loads the DiT), but
            # its ModelConfig inspects it; the omni thinker class needs torchvision to import.
            # A plain text architecture keeps that inspection cheap and dependency-free.
            hf_overrides={"architectures": ["Qwen2ForCausalLM"]},
            additional_config={CONFIG_KEY: msgspec.to_builtins(cfg)},
        )
        vllm_config = EngineArgs(model=model, **args).create_engine_config()
        self.core = EngineCore(vllm_config, Executor.get_class(vllm_config), log_stats=False)
        self.batcher = self.core.scheduler.batcher
        self.model = self.core.collective_rpc("get_model")[0]
        self.sample_rate: int = self.model.sample_rate

    # ---- requests ------------------------------------------------------------------------------
    def resolve(self, params: DiffusionParams | None) -> DiffusionParams:
        p = params or self.cfg.defaults
        return msgspec.structs.replace(
            p,
            seed=p.seed if p.seed is not None else random.SystemRandom().getrandbits(63),
            speaker=p.speaker or self.cfg.default_speaker,
        )

    def _check_ids(self, params: DiffusionParams, ids: Sequence[int], total: int) -> None:
        if total > self.cfg.max_input_len:
            raise DiffusionEngineInputError(f"{total} input ids: more than max_input_len {self.cfg.max_input_len}")
        if total * self.model.frames_per_input > self.model.max_frames:
            raise DiffusionEngineInputError(
                f"{total} input ids: longer than the model's {self.model.max_frames} frames"
            )
        try:
            self.model.check(params, ids)
        except DiffusionInputError as err:
            raise DiffusionEngineInputError(str(err)) from None

    def add_request(
        self,
        request_id: str,
        ids: Sequence[int],
        params: DiffusionParams | None = None,
        *,
        closed: bool = True,
        stream: bool | None = None,
    ) -> DiffusionParams:
        """Start a request on the ids known so far (more may follow with `add_inputs` unless
        `closed`); returns its resolved parameters (seed and speaker filled in)."""
        from omni_mp.engines.diffusion.batcher import DiffusionRequest

        resolved = self.resolve(params)
        if closed and not ids:
            raise DiffusionEngineInputError("empty input: no codec ids to synthesize")
        self._check_ids(resolved, ids, len(ids))
        req = DiffusionRequest(
            request_id=request_id,
            params=resolved,
            ids=list(ids),
            closed=closed,
            stream=self.cfg.stream if stream is None else stream,
        )
        self.core.add_request(req)  # type: ignore[arg-type]
        return resolved

    def add_inputs(self, request_id: str, ids: Sequence[int], closed: bool) -> None:
        req = self.batcher.requests.get(request_id)
        if req is None:
            return  # finished or aborted meanwhile
        if closed and not req.ids and not ids:
            raise DiffusionEngineInputError("empty input: upstream produced no codec ids")
        self._check_ids(req.params, ids, len(req.ids) + len(ids))
        self.batcher.extend(request_id, list(ids), closed)

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.core.abort_requests(request_ids)

    # ---- stepping ------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.core.scheduler.has_requests()

    def can_step(self) -> bool:
        """A step would advance something (not only requests waiting for upstream ids)."""
        return self.batcher.runnable()

    def step(self) -> tuple[list[AudioStepOutput], bool]:
        outputs, executed = self.core.step()
        result: list[AudioStepOutput] = []
        for per_client in outputs.values():
            for out in per_client.outputs:
                reason = None if out.finish_reason is None else str(out.finish_reason)
                error = out.stop_reason if isinstance(out.stop_reason, str) else None
                result.append(AudioStepOutput(out.request_id, out.pooling_output, out.finished, reason, error))
        return result, executed

    def shutdown(self) -> None:
        self.core.shutdown()

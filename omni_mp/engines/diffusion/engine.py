"""A diffusion stage engine: vLLM 0.25.0's `EngineCore`, in the stage process, running omni_mp's
diffusion scheduler and worker (`omni_mp.engines.diffusion.vllm_hooks`).

The stage loop drives it like the AR engine (`omni_mp.engines.base.StageEngine`): prepare
and add requests (with `open_inputs`, their input ids keep arriving through `extend` until
closed), `step()` while `can_step()`, abort. Each step advances every running trajectory by
one solver step; a step's outputs are audio chunks (`StepOutput.info`: float32 samples and
their sample rate, see omni_mp.wire.outputs), the last one of a request marked finished.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from omni_mp.engines.base import EngineInputError, Extension, PromptIds, StageInput, StepOutput
from omni_mp.engines.diffusion.model import DiffusionInputError, RequestModel
from omni_mp.engines.diffusion.params import DiffusionParams, DiffusionStageConfig
from omni_mp.engines.diffusion.stand_in_config import stand_in_config_path
from omni_mp.wire.messages import SamplingParamsMsg
from omni_mp.wire.outputs import audio_info


@dataclass(frozen=True, slots=True)
class PreparedDiffusion:
    request_id: str
    ids: list[int]
    params: DiffusionParams | Any
    inputs: Any = None  # a RequestModel's request inputs
    context: int = 0  # StageInput.context_ids


class DiffusionEngine:
    def __init__(
        self,
        model: str,
        cfg: DiffusionStageConfig,
        engine_args: dict[str, Any] | None = None,
        *,
        open_inputs: bool = False,
    ) -> None:
        """`open_inputs`: requests started with `add_request` take more ids (`add_inputs`)
        until closed; set for stages fed by a processor that streams its inputs."""
        from vllm.engine.arg_utils import EngineArgs

        from omni_mp.engines.diffusion.vllm_hooks import CONFIG_KEY, WORKER_CLS, DiffusionCoreDriver, DiffusionScheduler
        from omni_mp.engines.vllm_hooks import build_engine_core

        self.cfg = cfg
        self.open_inputs = open_inputs
        self._failed: dict[str, str] = {}
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
        stand_in = stand_in_config_path(model)  # a config.json transformers cannot read (Qwen3-TTS)
        if stand_in is not None:
            args.setdefault("hf_config_path", stand_in)
        # The worker runs in this process: vLLM's CPU platform swaps "uni" for "mp" unless this is
        # 0 while the config is made (stage processes have it set; restored for embedders).
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        self.driver = DiffusionCoreDriver(build_engine_core(EngineArgs(model=model, **args), env=env))
        self.batcher = self.driver.batcher
        self.model = self.driver.model()
        warm, warm_err = self.driver.graph_warmup()
        self.warmup_note: str | None = None  # what the start-up warm-up did, for the stage's Ready line
        if warm is not None and warm.graphs:
            self.warmup_note = f"{warm.graphs} CUDA graphs captured in {warm.seconds:.1f}s"
        elif warm_err is not None:
            self.warmup_note = f"CUDA graph warm-up failed ({warm_err}); capturing on first use"
        self.sample_rate: int = self.model.sample_rate
        # Requests carry their own inputs and params (an image DiT), not codec ids.
        self.owned: bool = isinstance(self.model, RequestModel)
        try:  # fail at start-up, not on the first request
            if not self.owned:
                self.model.check(self.resolve(None), [])
        except DiffusionInputError as err:
            self.driver.shutdown()
            raise ValueError(f"diffusion.default_speaker / defaults: {err}") from None

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
            raise EngineInputError(f"{total} input ids: more than max_input_len {self.cfg.max_input_len}")
        if total * self.model.frames_per_input > self.model.max_frames:
            raise EngineInputError(f"{total} input ids: longer than the model's {self.model.max_frames} frames")
        try:
            self.model.check(params, ids)
        except DiffusionInputError as err:
            raise EngineInputError(str(err)) from None

    def tokenize(self, text: str, *, literal: bool = False) -> list[int]:
        raise EngineInputError("a diffusion stage takes codec ids (prompt_token_ids), not text")

    def decode(self, token_ids: list[int]) -> str | None:
        return None

    def prepare(
        self, request_id: str, sampling: SamplingParamsMsg, stage_input: StageInput, speaker: str | None = None
    ) -> PreparedDiffusion:
        """The ids known so far, the stage's default parameters, the request's seed
        (`sampling.seed`) and speaker. A RequestModel's request: what its `parse` makes of it."""
        if stage_input.forced_reply:
            raise EngineInputError("a diffusion stage generates no reply to give (forced_reply)")
        if self.owned:
            try:
                params, inputs = self.model.parse(stage_input, sampling.seed)  # type: ignore[attr-defined]
            except DiffusionInputError as err:
                raise EngineInputError(str(err)) from None
            return PreparedDiffusion(request_id, [], params, inputs)
        inp = stage_input
        if inp.prompt_embeds is not None or inp.step_embeds or inp.step_rows is not None or inp.positions is not None:
            raise EngineInputError("a diffusion stage takes codec ids, not embeddings")
        if stage_input.prompt_text is not None or stage_input.multi_modal:
            raise EngineInputError("a diffusion stage takes codec ids, not text or media")
        ids = list(stage_input.prompt_token_ids or [])
        if not 0 <= stage_input.context_ids <= len(ids) or stage_input.context_ids % self.model.window_align:
            raise EngineInputError(
                f"context_ids {stage_input.context_ids}: not a multiple of {self.model.window_align} within the prompt"
            )
        params = msgspec.structs.replace(self.cfg.defaults, seed=sampling.seed, speaker=speaker)
        return PreparedDiffusion(request_id, ids, params, context=stage_input.context_ids)

    def add(self, prepared: PreparedDiffusion) -> PromptIds:  # type: ignore[override]
        if self.owned:
            from omni_mp.engines.diffusion.batcher import DiffusionRequest

            if prepared.request_id in self.batcher.requests:
                raise EngineInputError(f"request id {prepared.request_id!r} is already active")
            req = DiffusionRequest(prepared.request_id, prepared.params, [], True, False, inputs=prepared.inputs)
            self.driver.add(req)
            return PromptIds(0, None)
        self.submit(
            prepared.request_id, prepared.ids, prepared.params, closed=not self.open_inputs, context=prepared.context
        )
        return PromptIds(len(prepared.ids), list(prepared.ids))

    def check_params(self, params: dict[str, Any] | None) -> None:
        if not self.owned:
            return  # codec-id models take no per-request model parameters
        try:
            self.model.check_params(params)  # type: ignore[attr-defined]
        except DiffusionInputError as err:
            raise EngineInputError(str(err)) from None

    @property
    def speakers(self) -> frozenset[str] | None:
        names = getattr(self.model, "speakers", None)  # models without voices have none
        return None if names is None else frozenset(names)

    def submit(
        self,
        request_id: str,
        ids: Sequence[int],
        params: DiffusionParams | None = None,
        *,
        closed: bool = True,
        stream: bool | None = None,
        context: int = 0,
    ) -> DiffusionParams:
        """Start a request on the ids known so far (more may follow with `add_inputs` unless
        `closed`); returns its resolved parameters (seed and speaker filled in)."""
        from omni_mp.engines.diffusion.batcher import DiffusionRequest

        if request_id in self.batcher.requests:
            raise EngineInputError(f"request id {request_id!r} is already active")
        resolved = self.resolve(params)
        if closed and not ids:
            raise EngineInputError("empty input: no codec ids to synthesize")
        self._check_ids(resolved, ids, len(ids))
        req = DiffusionRequest(
            request_id=request_id,
            params=resolved,
            ids=list(ids),
            closed=closed,
            stream=self.cfg.stream if stream is None else stream,
            emitted=context,
            context=context,
        )
        self.driver.add(req)
        return resolved

    def extend(self, request_id: str, extension: Extension) -> None:
        if extension.step_rows is not None:
            raise EngineInputError("a diffusion stage takes codec ids, not embeddings")
        req = self.batcher.requests.get(request_id)
        if req is None:
            return  # finished or aborted meanwhile
        ids = list(extension.input_ids)
        if extension.closed and not req.ids and not ids:
            raise EngineInputError("empty input: upstream produced no codec ids")
        self._check_ids(req.params, ids, len(req.ids) + len(ids))
        self.batcher.extend(request_id, ids, extension.closed)

    def abort(self, request_ids: list[str]) -> None:
        self.driver.abort(request_ids)

    # ---- stepping ------------------------------------------------------------------------------
    def can_step(self) -> bool:
        return self.driver.can_step()

    def step(self) -> tuple[list[StepOutput], bool]:
        self.batcher.progress = (0, 0)
        outputs, executed = self.driver.step()
        result: list[StepOutput] = []
        for out in outputs:
            if isinstance(out.stop_reason, str):  # the worker could not serve it (see take_failed)
                self._failed[out.request_id] = out.stop_reason
                continue
            reason = None if out.finish_reason is None else str(out.finish_reason)
            if out.pooling_output is None:
                info = None
            elif self.owned:
                info = self.model.output_info(out.pooling_output)  # type: ignore[attr-defined]
            else:
                info = audio_info(out.pooling_output, self.sample_rate)
            result.append(StepOutput(out.request_id, [], out.finished, reason, info))
        return result, executed

    def step_progress(self) -> tuple[int, int]:
        return self.batcher.progress

    def take_failed(self) -> dict[str, str]:
        failed, self._failed = self._failed, {}
        return failed

    def shutdown(self) -> None:
        self.driver.shutdown()

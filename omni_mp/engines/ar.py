"""An autoregressive stage engine: vLLM 0.25.0's `EngineCore`, run in the stage process itself.

The stage loop owns the engine: it adds requests, calls `step()` and forwards each step's
new tokens (and, when configured, the hidden states the step computed). There is no
engine-core client and no extra engine process; with `VLLM_ENABLE_V1_MULTIPROCESSING=0`
(set by the coordinator for every stage) the platform keeps the `UniProcExecutor`, so the
model worker runs in this process too: nothing to orphan, and the per-step hooks of
`vllm_hooks` share memory with the stage loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from omni_mp.engines.base import EngineInputError, PromptIds, StepOutput
from omni_mp.engines.vllm_hooks import CapturedRows, StepEmbeds, StepIO, engine_core_cls, gated_scheduler_cls
from omni_mp.wire.messages import SamplingParamsMsg


@dataclass(frozen=True, slots=True)
class EngineFeatures:
    """What the stage needs beyond plain token generation (see vllm_hooks)."""

    hidden_states: bool = False  # capture the last layer's hidden states of every computed token
    hidden_layers: tuple[int, ...] = ()  # and these HF-numbered intermediate layers
    prompt_embeds: bool = False  # prompts may come as embeddings
    step_embeds: bool = False  # decode steps may add per-step extra embeddings


class AREngine:
    def __init__(self, model: str, engine_args: dict[str, Any], features: EngineFeatures = EngineFeatures()) -> None:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.engine.input_processor import InputProcessor
        from vllm.v1.executor import Executor

        self.features = features
        self.io = StepIO(
            capturing=features.hidden_states,
            capture_layers=list(features.hidden_layers),
            step_embeds=features.step_embeds,
        )
        hooked = self.io.capturing or features.step_embeds  # needs vllm_hooks in the model runner
        self.hooked = hooked
        args = dict(engine_args)
        if self.io.capturing:
            # A prefix-cache hit skips computing the cached tokens: their hidden states would be missing.
            args["enable_prefix_caching"] = False
        if features.prompt_embeds or features.step_embeds:
            # Step embeddings are added into the persistent inputs_embeds buffer (vllm_hooks),
            # which the model reads only when prompt embeddings are enabled.
            args["enable_prompt_embeds"] = True
        if features.step_embeds:
            # Synchronous scheduling: the gate decides from the inputs of the step it schedules.
            args["scheduler_cls"] = gated_scheduler_cls(Scheduler, self.io)
            args["async_scheduling"] = False
        if hooked:
            # The hooks override the V1 runner's `_model_forward`; vLLM 0.25.0 picks its V2
            # runner on CUDA by default, which has no such override point.
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        vllm_config = EngineArgs(model=model, **args).create_engine_config()
        if hooked and vllm_config.parallel_config.world_size != 1:
            raise ValueError("hidden-state output and step embeddings need a single-worker stage (no TP/PP)")
        self.vllm_config = vllm_config
        core_cls = engine_core_cls(self.io) if hooked else EngineCore
        self.core = core_cls(vllm_config, Executor.get_class(vllm_config), log_stats=False)
        self._inputs = InputProcessor(vllm_config)
        self._tasks = self.core.get_supported_tasks()
        # The width of the model's input embeddings (prompt and step embeddings): its hidden
        # size, unless its config sets vLLM's `projection_size` (e.g. a model that projects its
        # inputs itself; vLLM 0.25.0 sizes the runner's inputs_embeds buffer by this).
        self.inputs_embeds_size: int = vllm_config.model_config.get_inputs_embeds_size()
        self.vocab_size: int = vllm_config.model_config.get_vocab_size()
        self.uses_mrope: bool = bool(vllm_config.model_config.uses_mrope)
        self.dtype: torch.dtype = vllm_config.model_config.dtype

    @property
    def tokenizer(self) -> Any | None:
        return self._inputs.tokenizer

    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise EngineInputError("this stage has no tokenizer (skip_tokenizer_init): send prompt_token_ids")
        return list(self.tokenizer.encode(text))

    def decode(self, token_ids: list[int]) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(token_ids)

    @property
    def speakers(self) -> frozenset[str] | None:
        return None  # an AR stage's voice, if any, is its processor's business

    def to_vllm_sampling(self, p: SamplingParamsMsg) -> Any:
        from vllm import SamplingParams

        allowed = None
        if p.suppress_token_ids:
            # vLLM's allowed_token_ids masks the others to -inf before sampling: exactly
            # transformers' suppress_tokens (a logit bias would not be exact).
            suppressed = set(p.suppress_token_ids)
            allowed = [t for t in range(self.vocab_size) if t not in suppressed]
        return SamplingParams(
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            seed=p.seed,
            repetition_penalty=p.repetition_penalty,
            stop_token_ids=list(p.stop_token_ids),
            ignore_eos=p.ignore_eos,
            allowed_token_ids=allowed,
            detokenize=False,  # the stage decodes final text itself, once
        )

    def _check_embeds(self, what: str, embeds: torch.Tensor) -> torch.Tensor:
        # vLLM checks only ndim on this path; a wrong width would be copied into its buffers.
        if embeds.ndim != 2 or embeds.shape[1] != self.inputs_embeds_size:
            raise EngineInputError(
                f"{what}: expected [n, {self.inputs_embeds_size}] (the model's input-embedding width), "
                f"got {list(embeds.shape)}"
            )
        if not embeds.dtype.is_floating_point:
            raise EngineInputError(f"{what}: expected a floating-point tensor, got {embeds.dtype}")
        return embeds.to(self.dtype)

    def add_request(
        self,
        request_id: str,
        sampling: SamplingParamsMsg,
        *,
        prompt_token_ids: list[int] | None = None,
        prompt_embeds: torch.Tensor | None = None,
        prompt_text: str | None = None,
        multi_modal: dict[str, list[Any]] | None = None,
        positions: tuple[torch.Tensor, int] | None = None,
        step_embeds: StepEmbeds | None = None,
        speaker: str | None = None,
    ) -> PromptIds:
        """Validate with vLLM's own input processor, hand the request to the scheduler, and
        return its prompt. `prompt_text` (with `multi_modal` data) is tokenized and its media
        placeholders expanded by vLLM's processor for the model. `prompt_embeds` with
        `prompt_token_ids`: an embeddings prompt whose ids only count for repetition penalties.
        `positions`: M-RoPE positions of the prompt's first rows and the offset of every later
        one (vllm_hooks). With `step_embeds`, decode step k adds `step_embeds.row(k)` to its
        input embedding and waits for it to arrive."""
        from vllm.inputs.engine import embeds_input, tokens_input

        if prompt_embeds is not None:
            if not self.features.prompt_embeds:
                raise EngineInputError("this stage does not take prompt embeddings")
            embeds = self._check_embeds("prompt_embeds", prompt_embeds)
            if prompt_token_ids is None:
                prompt: Any = embeds_input(embeds)
            elif len(prompt_token_ids) != embeds.shape[0]:
                raise EngineInputError(
                    f"prompt_token_ids with prompt_embeds: {len(prompt_token_ids)} ids for {embeds.shape[0]} rows"
                )
            else:  # mixed mode, every position an embedding: the ids are bookkeeping only
                ids = list(prompt_token_ids)
                prompt = embeds_input(embeds, prompt_token_ids=ids, is_token_ids=[False] * len(ids))
        elif prompt_token_ids is not None:
            prompt = tokens_input(prompt_token_ids)
        elif prompt_text is not None:
            prompt = {"prompt": prompt_text}
            if multi_modal:
                prompt["multi_modal_data"] = multi_modal
        else:
            raise EngineInputError("a request needs prompt_token_ids, prompt_embeds or a prompt text")
        if step_embeds is not None and not self.features.step_embeds:
            raise EngineInputError("this stage does not take per-step embeddings")
        try:
            params = self.to_vllm_sampling(sampling)
            req = self._inputs.process_inputs(request_id, prompt, params, self._tasks, arrival_time=time.time())
        except (ValueError, TypeError, KeyError) as err:  # vLLM's processors raise all three on bad media
            raise EngineInputError(str(err)) from err
        prompt_len = req.prompt_embeds.shape[0] if req.prompt_embeds is not None else len(req.prompt_token_ids or [])
        if positions is not None:
            positions = self._check_positions(positions, prompt_len)
        if step_embeds is not None:
            if step_embeds.fill is not None:
                step_embeds.fill = self._check_embeds("step embeddings", step_embeds.fill[None])[0]
            self.io.step_embeds[request_id] = step_embeds
            self.io.prompt_lens[request_id] = prompt_len
        if positions is not None:
            self.io.positions[request_id] = positions
        request, wave = self.core.preprocess_add_request(req)
        self.core.add_request(request, wave)
        return PromptIds(prompt_len, None if req.prompt_token_ids is None else list(req.prompt_token_ids))

    def _check_positions(self, positions: tuple[torch.Tensor, int], prompt_len: int) -> tuple[torch.Tensor, int]:
        if not self.uses_mrope:
            raise EngineInputError("positions: this stage's model does not use M-RoPE")
        if not self.hooked:
            raise EngineInputError("positions: this stage has no runner hooks (step embeddings or hidden states)")
        pos, delta = positions
        if pos.ndim != 2 or pos.shape[0] != 3 or not 0 < pos.shape[1] <= prompt_len:
            raise EngineInputError(f"positions: expected [3, P] with 0 < P <= {prompt_len}, got {list(pos.shape)}")
        if pos.dtype.is_floating_point or pos.dtype == torch.bool:
            raise EngineInputError(f"positions: expected integers, got {pos.dtype}")
        return pos.to(torch.int64).cpu(), int(delta)

    def add_inputs(self, request_id: str, ids: Sequence[int], closed: bool) -> None:
        raise EngineInputError("an AR stage takes its whole prompt at once")

    def add_step_embeds(self, request_id: str, rows: torch.Tensor) -> None:
        se = self.io.step_embeds[request_id]
        se.rows.extend(self._check_embeds("step embeddings", rows).unbind(0))

    def close_step_embeds(self, request_id: str) -> None:
        se = self.io.step_embeds.get(request_id)
        if se is not None:
            se.closed = True

    def collect_hidden(self, finishing: set[str]) -> dict[str, list[CapturedRows]]:
        """Hidden-state rows whose copies to the host are complete; waits for those of
        `finishing` requests (their last rows must go out with their last chunk)."""
        return self.io.collect(finishing)

    def take_failed(self) -> dict[str, str]:
        """Requests the runner could not serve as asked, with the reason (each reported once)."""
        failed, self.io.failed = self.io.failed, {}
        return failed

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.core.abort_requests(request_ids)
        for rid in request_ids:
            self.io.forget(rid)

    def has_work(self) -> bool:
        return self.core.scheduler.has_requests() or bool(self.core.batch_queue)

    def can_step(self) -> bool:
        """Work that a step can advance now (not only requests waiting for step embeddings)."""
        sched = self.core.scheduler
        if self.core.batch_queue:  # a batch in flight (async scheduling): its outputs are due
            return True
        if not sched.has_requests():
            return False
        if not self.io.step_embeds or sched.get_num_unfinished_requests() > len(sched.running):
            return True
        return any(self.io.decode_ready(r.request_id, r.num_computed_tokens) for r in sched.running)

    def step(self) -> tuple[list[StepOutput], bool]:
        """One engine step over the whole batch; also says whether any token was computed.
        With async scheduling (vLLM's default on CUDA) a step launches the next batch before
        taking the outputs of the previous one, so the GPU never waits for the host."""
        outputs, executed = self.core.step_fn()
        self.core.post_step(executed)
        result: list[StepOutput] = []
        for per_client in (outputs or {}).values():
            for out in per_client.outputs:
                reason = None if out.finish_reason is None else str(out.finish_reason)
                result.append(StepOutput(out.request_id, list(out.new_token_ids), out.finished, reason))
                if out.finished:
                    self.io.step_embeds.pop(out.request_id, None)
                    self.io.prompt_lens.pop(out.request_id, None)
                    self.io.finished(out.request_id)
        return result, executed

    def shutdown(self) -> None:
        self.core.shutdown()

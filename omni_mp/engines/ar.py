"""An autoregressive stage engine: vLLM 0.25.0's `EngineCore`, run in the stage process itself.

The stage loop owns the engine: it adds requests, calls `step()` and forwards each step's
new tokens. There is no engine-core client and no extra engine process; with
`VLLM_ENABLE_V1_MULTIPROCESSING=0` (set by the stage before vLLM is imported) the CPU
platform keeps the `UniProcExecutor`, so the model worker runs in this process too: nothing
to orphan, and per-step model state is reachable without another IPC hop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from omni_mp.payload import SamplingParamsMsg


@dataclass(frozen=True, slots=True)
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None


class EngineInputError(ValueError):
    """vLLM rejected a request's input (too long, token id out of range, bad sampling params)."""


class AREngine:
    def __init__(self, model: str, engine_args: dict[str, Any]) -> None:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.engine.input_processor import InputProcessor
        from vllm.v1.executor import Executor

        vllm_config = EngineArgs(model=model, **engine_args).create_engine_config()
        self.vllm_config = vllm_config
        self.core = EngineCore(vllm_config, Executor.get_class(vllm_config), log_stats=False)
        self._inputs = InputProcessor(vllm_config)
        self._tasks = self.core.get_supported_tasks()
        self.max_model_len = vllm_config.model_config.max_model_len

    @property
    def tokenizer(self) -> Any | None:
        return self._inputs.tokenizer

    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise EngineInputError("this stage has no tokenizer (skip_tokenizer_init): send prompt_token_ids")
        return list(self.tokenizer.encode(text))

    def decode(self, token_ids: list[int]) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(token_ids)

    @staticmethod
    def to_vllm_sampling(p: SamplingParamsMsg) -> Any:
        from vllm import SamplingParams

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
            detokenize=False,  # the stage decodes final text itself, once
        )

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParamsMsg) -> None:
        """Validate with vLLM's own input processor, then hand the request to the scheduler."""
        from vllm.inputs.engine import tokens_input

        try:
            params = self.to_vllm_sampling(sampling)
            req = self._inputs.process_inputs(
                request_id, tokens_input(prompt_token_ids), params, self._tasks, arrival_time=time.time()
            )
        except (ValueError, TypeError) as err:
            raise EngineInputError(str(err)) from err
        request, wave = self.core.preprocess_add_request(req)
        self.core.add_request(request, wave)

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.core.abort_requests(request_ids)

    def has_work(self) -> bool:
        return self.core.scheduler.has_requests()

    def step(self) -> list[StepOutput]:
        outputs, executed = self.core.step()
        self.core.post_step(executed)
        result: list[StepOutput] = []
        for per_client in outputs.values():
            for out in per_client.outputs:
                reason = None if out.finish_reason is None else str(out.finish_reason)
                result.append(StepOutput(out.request_id, list(out.new_token_ids), out.finished, reason))
        return result

    def shutdown(self) -> None:
        self.core.shutdown()

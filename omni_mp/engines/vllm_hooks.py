"""The one place omni_mp reaches into vLLM 0.25.0 internals: per-step hidden states out,
per-step extra input embeddings in, and holding back requests whose extras have not arrived.

Why here and how small:
- vLLM 0.25.0 has no per-step hidden-state output (`extract_hidden_states` is CUDA-only,
  disk-based and runs at request end) and no per-step input-embedding hook.
- `GPUModelRunner._model_forward` is vLLM's own override point ("can be overridden by
  subclasses for model execution"); `CPUModelRunner` inherits it. `OmniRunnerMixin`
  overrides only that method. The platform builds its runner class inside
  `Worker.init_device`; `install_runner_hooks` gives that instance a subclass of its own
  class with the mixin (so CPU and GPU share one code path, and no vLLM method is copied).
- The scheduler must not schedule a decode step whose extra embedding has not arrived yet;
  `gated_scheduler_cls` subclasses the configured scheduler and hides such requests from
  one `schedule()` call (they keep their KV cache and stay running).
- Everything runs in the stage process (UniProcExecutor), so the stage loop, scheduler and
  runner share `StepIO` directly: no serialization of hidden states inside vLLM.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class CapturedRows:
    """Hidden states of the tokens one forward pass computed for one request."""

    start: int  # position of the first row in the request's sequence
    last: torch.Tensor  # [n, hidden]: last layer after the final norm (what lm_head sees)
    layers: dict[int, torch.Tensor]  # HF-numbered intermediate layers (0 = embeddings)


@dataclass
class StepEmbeds:
    """Extra input embeddings for one request's decode steps: row k is added to the input
    embedding of generated token k (the k-th decode input). After `closed`, missing rows
    are `fill` (e.g. a pad embedding), so the request never waits on a finished upstream."""

    rows: list[torch.Tensor] = field(default_factory=list)  # each [hidden]
    closed: bool = False
    fill: torch.Tensor | None = None

    def row(self, k: int) -> torch.Tensor | None:
        if k < len(self.rows):
            return self.rows[k]
        if self.closed:
            return self.fill
        return None

    def ready(self, k: int) -> bool:
        return k < len(self.rows) or self.closed


class StepIO:
    """Shared by the stage loop (writer of extras, reader of captures), the scheduler (reads
    readiness) and the model runner (reads extras, writes captures). One thread uses it at a
    time (the stage loop calls into the engine), the lock only guards against misuse."""

    def __init__(self, capturing: bool, capture_layers: list[int]) -> None:
        self.capturing = capturing  # the last layer always; intermediate layers when listed
        self.capture_layers = sorted(set(capture_layers)) if capturing else []
        self.captured: dict[str, list[CapturedRows]] = {}
        self.step_embeds: dict[str, StepEmbeds] = {}
        self.prompt_lens: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, request_id: str) -> list[CapturedRows]:
        with self._lock:
            return self.captured.pop(request_id, [])

    def forget(self, request_id: str) -> None:
        with self._lock:
            self.captured.pop(request_id, None)
            self.step_embeds.pop(request_id, None)
            self.prompt_lens.pop(request_id, None)

    def decode_ready(self, request_id: str, num_computed_tokens: int) -> bool:
        """May the next step of this request run? Prefill always may; a decode step needs its
        extra row when the request takes extras."""
        extras = self.step_embeds.get(request_id)
        if extras is None:
            return True
        k = num_computed_tokens - self.prompt_lens[request_id]
        return k < 0 or extras.ready(k)


class OmniRunnerMixin:
    """Overrides `_model_forward` of whatever model runner the platform built."""

    omni_io: StepIO
    _omni_layer_out: dict[int, torch.Tensor]

    def _model_forward(
        self,
        input_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **model_kwargs: Any,
    ) -> Any:
        io = self.omni_io
        batch = self.input_batch  # type: ignore[attr-defined]
        num_reqs = batch.num_reqs
        req_ids: list[str] = batch.req_ids[:num_reqs]
        qsl = self.query_start_loc.np[: num_reqs + 1].tolist()  # type: ignore[attr-defined]
        starts = batch.num_computed_tokens_cpu[:num_reqs].tolist()
        if io.step_embeds:
            input_ids, inputs_embeds = self._omni_add_step_embeds(req_ids, qsl, starts, input_ids, inputs_embeds)
        self._omni_layer_out = {}
        out = super()._model_forward(  # type: ignore[misc]
            input_ids=input_ids,
            positions=positions,
            intermediate_tensors=intermediate_tensors,
            inputs_embeds=inputs_embeds,
            **model_kwargs,
        )
        if io.capturing:
            hidden = out[0] if isinstance(out, tuple) else out
            self._omni_capture(req_ids, qsl, starts, hidden)
        return out

    def _omni_add_step_embeds(
        self,
        req_ids: list[str],
        qsl: list[int],
        starts: list[int],
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        io = self.omni_io
        rows: list[int] = []
        extras: list[torch.Tensor] = []
        for i, rid in enumerate(req_ids):
            se = io.step_embeds.get(rid)
            if se is None:
                continue
            prompt_len = io.prompt_lens[rid]
            for j in range(qsl[i + 1] - qsl[i]):
                k = starts[i] + j - prompt_len
                if k < 0:
                    continue  # prompt positions carry their own embeddings
                extra = se.row(k)
                if extra is None:  # the gated scheduler does not schedule such steps
                    raise RuntimeError(f"request {rid}: decode step {k} scheduled before its extra embedding arrived")
                rows.append(qsl[i] + j)
                extras.append(extra)
        if not rows:
            return input_ids, inputs_embeds
        if inputs_embeds is None:
            assert input_ids is not None
            inputs_embeds = self.model.embed_input_ids(input_ids)  # type: ignore[attr-defined]
        else:
            inputs_embeds = inputs_embeds.clone()  # the runner's persistent buffer stays untouched
        index = torch.tensor(rows, device=inputs_embeds.device)
        add = torch.stack(extras).to(device=inputs_embeds.device, dtype=inputs_embeds.dtype)
        inputs_embeds.index_add_(0, index, add)
        return None, inputs_embeds

    def _omni_capture(self, req_ids: list[str], qsl: list[int], starts: list[int], hidden: torch.Tensor) -> None:
        io = self.omni_io
        n = qsl[-1]
        last = hidden[:n].to("cpu", copy=True)
        layers = {k: v[:n].to("cpu", copy=True) for k, v in self._omni_layer_out.items()}
        with io._lock:
            for i, rid in enumerate(req_ids):
                a, b = qsl[i], qsl[i + 1]
                if a == b:
                    continue
                io.captured.setdefault(rid, []).append(
                    CapturedRows(
                        start=starts[i],
                        last=last[a:b],
                        layers={k: v[a:b] for k, v in layers.items()},
                    )
                )


def _layer_hook(runner: Any, hf_index: int) -> Callable[..., None]:
    """A forward hook storing the residual stream after a decoder layer: vLLM's layers return
    (hidden, residual) with the stream = hidden + residual, which is HF's hidden_states[i+1]."""

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, tuple) and len(output) == 2 and output[1] is not None:
            runner._omni_layer_out[hf_index] = output[0] + output[1]
        else:
            runner._omni_layer_out[hf_index] = output[0] if isinstance(output, tuple) else output

    return hook


def _embedding_hook(runner: Any) -> Callable[..., None]:
    def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        runner._omni_layer_out[0] = output

    return hook


def install_runner_hooks(worker: Any, io: StepIO) -> None:
    """Called in the worker (via collective_rpc): give its runner the mixin and the layer hooks."""
    runner = worker.model_runner
    base = type(runner)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not isinstance(runner, GPUModelRunner):  # e.g. the V2 runner: no `_model_forward`
        raise RuntimeError(f"omni_mp's runner hooks need vLLM's V1 model runner, got {base.__qualname__}")
    runner.__class__ = type(f"Omni{base.__name__}", (OmniRunnerMixin, base), {})
    runner.omni_io = io
    runner._omni_layer_out = {}
    if not io.capture_layers:
        return
    model = runner.get_model()
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no `.model.layers`: intermediate hidden states are unsupported")
    for hf_index in io.capture_layers:
        if hf_index == 0:
            decoder.embed_tokens.register_forward_hook(_embedding_hook(runner))
        elif 1 <= hf_index <= len(layers) - 1:
            layers[hf_index - 1].register_forward_hook(_layer_hook(runner, hf_index))
        else:
            raise ValueError(
                f"hidden_states.layers: {hf_index} is not an intermediate layer (0..{len(layers) - 1}; "
                f"{len(layers)} = the last layer, always included)"
            )


def gated_scheduler_cls(base: type, io: StepIO) -> type:
    """A subclass of the configured scheduler that skips, for one `schedule()`, every running
    request whose next decode step's extra embedding has not arrived (it stays running)."""

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        held = [r for r in self.running if not io.decode_ready(r.request_id, r.num_computed_tokens)]
        if not held:
            return base.schedule(self, *args, **kwargs)
        order = {id(r): i for i, r in enumerate(self.running)}
        held_ids = {id(r) for r in held}
        self.running = [r for r in self.running if id(r) not in held_ids]
        try:
            return base.schedule(self, *args, **kwargs)
        finally:
            kept = [r for r in self.running if id(r) in order]
            new = [r for r in self.running if id(r) not in order]
            self.running = sorted(kept + held, key=lambda r: order[id(r)]) + new

    return type(f"OmniGated{base.__name__}", (base,), {"schedule": schedule})

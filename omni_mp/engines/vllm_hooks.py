"""The one place omni_mp reaches into vLLM 0.25.0 internals: per-step hidden states out,
per-step extra input embeddings in, and holding back requests whose extras have not arrived.

Why here, and why it works with CUDA graphs and torch.compile on (vLLM's GPU default):
- vLLM compiles the model's forward and replays captured CUDA graphs: a Python forward hook
  inside the model never runs under a graph, and a tensor passed in place of the runner's
  persistent input buffer is never read by one (the graph reads the captured addresses).
  So nothing here hooks modules or replaces inputs:
  * intermediate layers come out of the model itself, through vLLM's EAGLE-3 aux-hidden-state
    outputs (`SupportsEagle3.set_aux_hidden_state_layers`; its layer numbering is HF's:
    0 = embeddings, i = output of layer i-1). They are set before the first forward, so the
    compiled graph and every captured CUDA graph return them;
  * per-step extra embeddings are added in place into the runner's persistent `inputs_embeds`
    buffer (the one the graphs read), after vLLM has written the step's embeddings into it;
  * the last layer is the model's own output; rows are gathered on the GPU (one small
    device copy, since graph outputs are reused by the next replay) and copied to pinned
    host memory on a side stream, so the host never waits for the GPU to take them.
  What cannot work is refused when the engine loads, with the reason.
- `GPUModelRunner._model_forward` is vLLM's documented override point ("can be overridden by
  subclasses for model execution"); `CPUModelRunner` inherits it. `OmniRunnerMixin` overrides
  only that method, on a per-instance subclass of whatever runner the platform built (CPU and
  GPU share one code path, no vLLM method is copied). The V2 runner (CUDA's default in
  0.25.0) has no such point: the engine selects the V1 runner for hooked stages.
- `OmniEngineCore` installs the runner hooks between model loading and vLLM's first forward
  (the memory profile, which compiles), by overriding `EngineCore._initialize_kv_caches`.
- The scheduler must not schedule a decode step whose extra embedding has not arrived yet;
  `gated_scheduler_cls` subclasses the configured scheduler and hides such requests from
  one `schedule()` call (they keep their KV cache, their slot and stay running).
- M-RoPE positions (models whose config has `mrope_section`): the runner computes a prompt's
  positions once, in `_init_mrope_positions` (V1 runner, 0.25.0; `CPUModelRunner` inherits it).
  The mixin overrides it to record a capturing (thinker) stage's prompt positions, shipped with
  the request's first captured rows, and to replace a downstream (talker) request's prompt
  positions by the thinker's (image/video prompts have 3D positions). Decode positions follow
  from `mrope_position_delta`, which the override sets too.
- Models that keep per-request state on the device across steps (e.g. a talker whose next
  input needs its previous step's hidden state) define `omni_prepare_step(StepBatch)`: the
  mixin calls it before every forward with the step's requests and token layout, so the
  model can write its own static index buffers (read by captured graphs) outside the graph.
- Models with a part vLLM's CUDA graphs hold only in FULL (decode) graphs, which then runs
  eager in every other step, define `omni_capture_graphs()`: the mixin calls it once, after
  vLLM's own `capture_model`, so the model can capture that part alone (e.g. Qwen3-Omni's
  code predictor, which runs outside the compiled decoder).
- Everything runs in the stage process (UniProcExecutor), so the stage loop, scheduler and
  runner share `StepIO` directly: no serialization of hidden states inside vLLM.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from omni_mp.engines.base import ContextLengthError
from omni_mp.engines.rows import RowStream

# Captured steps not yet collected by the stage loop. The loop collects after every engine
# step and at most two batches are in flight, so reaching this means the loop stopped
# collecting: fail loudly rather than hold GPU-sized host buffers without bound.
MAX_PENDING_CAPTURES = 64


@dataclass
class CapturedRows:
    """Hidden states of the tokens one forward pass computed for one request."""

    start: int  # position of the first row in the request's sequence
    last: torch.Tensor  # [n, hidden]: last layer after the final norm (what lm_head sees)
    layers: dict[int, torch.Tensor]  # HF-numbered intermediate layers (0 = embeddings)
    # M-RoPE models, on the request's first rows only: the prompt's positions [3, L] (int64)
    # and the delta that continues them (position of row i >= L is i + delta on every axis).
    positions: tuple[torch.Tensor, int] | None = None


@dataclass
class CapturedStep:
    """The rows one forward pass computed, all captured tensors in one host buffer
    [1 + len(layers), num_tokens, hidden] (pinned on CUDA, filled asynchronously)."""

    host: torch.Tensor
    done: Any  # a torch.cuda.Event recorded after the copy, or None when already complete
    spans: dict[str, tuple[int, int, int]]  # request id -> (first row, end row, start position)
    positions: dict[str, tuple[torch.Tensor, int]] = field(default_factory=dict)  # see CapturedRows

    def ready(self) -> bool:
        return self.done is None or self.done.query()

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()
            self.done = None


@dataclass
class HookedRequest:
    """The engine's state of one request, shared by the stage's engine (writer), the gated
    scheduler and the runner hooks (readers). One object per request: released at once."""

    prompt_len: int
    # Extra input embeddings of decode steps: row k is added to the input embedding of
    # generated token k; past a closed stream's end, its fill row (e.g. a pad embedding).
    step_embeds: RowStream | None = None
    # M-RoPE prompt positions given for this request ([3, P] int64, delta): the first P prompt
    # rows take them, later rows continue as text at index + delta.
    positions: tuple[torch.Tensor, int] | None = None
    # Capturing stages: the prompt positions the runner computed, until shipped with the
    # request's first captured rows; `recorded` stays set (a preempted request is re-initialized).
    source_positions: tuple[torch.Tensor, int] | None = None
    recorded: bool = False
    hidden_next: int = 0  # position of the next captured row to hand out
    rows_wanted: bool = True  # False: nobody reads its rows (StageInput.rows_wanted): dropped
    # The first position whose rows are read (AREngine._rows_from): the prefix cache is read only
    # below it (`capped_cache_manager_cls`), so every row from there on is computed. 0: no cap
    # (either every row is read and the cache is skipped, or none is).
    rows_from: int = 0
    num_output: int = 0  # tokens generated so far

    def decode_ready(self, num_computed_tokens: int) -> bool:
        """May the next step run? Prefill always may; a decode step needs its extra row."""
        k = num_computed_tokens - self.prompt_len
        return self.step_embeds is None or k < 0 or self.step_embeds.ready(k)


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One forward's layout, for a model's `omni_prepare_step` (called before the forward,
    outside any captured graph). Request i computes tokens [query_start_loc[i],
    query_start_loc[i + 1]) of the flat batch, at positions num_computed[i] onwards."""

    req_ids: list[str]
    query_start_loc: list[int]
    num_computed: list[int]
    prompt_lens: list[int]
    num_input_tokens: int  # the forward's (padded) token count
    input_ids: torch.Tensor  # the runner's persistent buffer of this step's token ids (device)
    live: frozenset[str]  # every request the runner holds (scheduled this step or not)
    sampling: list[Any]  # each request's vLLM SamplingParams


class StepIO:
    """Shared by the engine (writer of extras, reader of captures), the scheduler (reads
    readiness) and the model runner (reads extras, writes captures). All of them run on the
    engine thread; the lock only guards against misuse from another thread."""

    def __init__(self, capturing: bool, capture_layers: list[int], step_embeds: bool = False) -> None:
        self.capturing = capturing  # the last layer always; intermediate layers when listed
        self.capture_layers = sorted(set(capture_layers)) if capturing else []
        self.takes_step_embeds = step_embeds
        self.pending: deque[CapturedStep] = deque()
        self.requests: dict[str, HookedRequest] = {}
        # Requests the runner could not serve as asked (request id -> reason): the stage
        # loop fails exactly these requests; the engine keeps running.
        self.failed: dict[str, str] = {}
        self._lock = threading.Lock()

    def add_capture(self, step: CapturedStep) -> None:
        with self._lock:
            if len(self.pending) >= MAX_PENDING_CAPTURES:
                raise RuntimeError(f"{MAX_PENDING_CAPTURES} captured steps were never collected")
            self.pending.append(step)

    def collect(self, wait_for: set[str] = frozenset()) -> dict[str, list[CapturedRows]]:
        """The captured rows whose copies are complete, per request, in step order. Steps that
        hold rows of a request in `wait_for` (about to finish) are waited for."""
        out: dict[str, list[CapturedRows]] = {}
        with self._lock:
            must = 0  # collect at least the steps up to the last one holding a waited-for request
            if wait_for:
                for i, step in enumerate(self.pending):
                    if not wait_for.isdisjoint(step.spans):
                        must = i + 1
            n = 0
            while self.pending and (n < must or self.pending[0].ready()):
                step = self.pending.popleft()
                step.wait()
                n += 1
                for rid, (a, b, start) in step.spans.items():
                    layers = {k: step.host[1 + i, a:b] for i, k in enumerate(self.capture_layers)}
                    rows = CapturedRows(start, step.host[0, a:b], layers, step.positions.get(rid))
                    out.setdefault(rid, []).append(rows)
        return out

    def release(self, request_id: str) -> None:
        """The request ended (finished, aborted or failed): forget everything about it."""
        with self._lock:
            self.requests.pop(request_id, None)
            self.failed.pop(request_id, None)

    def decode_ready(self, request_id: str, num_computed_tokens: int) -> bool:
        req = self.requests.get(request_id)
        return req is None or req.decode_ready(num_computed_tokens)


class OmniRunnerMixin:
    """Overrides `_model_forward` of whatever model runner the platform built."""

    omni_io: StepIO
    _omni_copy_stream: Any
    _omni_prepare: Any  # the model's `omni_prepare_step`, or None

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
        if io.takes_step_embeds and num_reqs:
            self._omni_add_step_embeds(req_ids, qsl, starts, inputs_embeds)
        if self._omni_prepare is not None and num_reqs:
            self._omni_prepare_step(req_ids, qsl, starts, input_ids, inputs_embeds)
        out = super()._model_forward(  # type: ignore[misc]
            input_ids=input_ids,
            positions=positions,
            intermediate_tensors=intermediate_tensors,
            inputs_embeds=inputs_embeds,
            **model_kwargs,
        )
        if io.capturing and num_reqs:
            hidden, aux = out if io.capture_layers else (out, [])
            self._omni_capture(req_ids, qsl, starts, hidden, aux)
        return out

    def capture_model(self) -> int:
        """vLLM's CUDA graph capture, then the model's own (`omni_capture_graphs`)."""
        from vllm.config import CUDAGraphMode

        size = super().capture_model()  # type: ignore[misc]
        runner: Any = self
        capture = getattr(runner.get_model(), "omni_capture_graphs", None)
        graphs = runner.compilation_config.cudagraph_mode != CUDAGraphMode.NONE
        if capture is not None and graphs and runner.device.type == "cuda":
            free = torch.cuda.mem_get_info()[0]
            capture()
            size += max(0, free - torch.cuda.mem_get_info()[0])
        return size

    def _omni_prepare_step(
        self,
        req_ids: list[str],
        qsl: list[int],
        starts: list[int],
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
    ) -> None:
        runner: Any = self
        n = (inputs_embeds if inputs_embeds is not None else input_ids).shape[0]  # type: ignore[union-attr]
        states = runner.requests
        self._omni_prepare(
            StepBatch(
                req_ids=req_ids,
                query_start_loc=qsl,
                num_computed=starts,
                prompt_lens=[states[rid].num_prompt_tokens for rid in req_ids],
                num_input_tokens=n,
                input_ids=runner.input_ids.gpu[:n],
                live=frozenset(states),
                sampling=[states[rid].sampling_params for rid in req_ids],
            )
        )

    def _init_mrope_positions(self, req_state: Any) -> None:
        """vLLM 0.25.0's V1 runner calls this for every new (and every resumed) request of an
        M-RoPE model; `req_state` is its `CachedRequestState`."""
        super()._init_mrope_positions(req_state)  # type: ignore[misc]
        io = self.omni_io
        req = io.requests.get(req_state.req_id)
        if req is None:
            return
        if req.positions is not None:
            pos, delta = req.positions
            n = req_state.mrope_positions.shape[1]  # the prompt (+ outputs, when resumed)
            full = (torch.arange(n, dtype=torch.int64) + delta).expand(3, n).clone()
            full[:, : pos.shape[1]] = pos
            req_state.mrope_positions = full
            req_state.mrope_position_delta = delta
        elif io.capturing and not req.recorded:
            req.recorded = True
            req.source_positions = (req_state.mrope_positions.clone(), int(req_state.mrope_position_delta))

    def _omni_add_step_embeds(
        self, req_ids: list[str], qsl: list[int], starts: list[int], inputs_embeds: torch.Tensor | None
    ) -> None:
        io = self.omni_io
        rows: list[int] = []
        extras: list[torch.Tensor] = []
        for i, rid in enumerate(req_ids):
            req = io.requests.get(rid)
            if req is None or req.step_embeds is None:
                continue
            se, prompt_len = req.step_embeds, req.prompt_len
            for j in range(qsl[i + 1] - qsl[i]):
                k = starts[i] + j - prompt_len
                if k < 0:
                    continue  # prompt positions carry their own embeddings
                extra = se.row(k)
                if extra is None:  # the gated scheduler does not schedule such steps
                    io.failed.setdefault(rid, f"decode step {k} was scheduled before its extra embedding arrived")
                    continue
                rows.append(qsl[i] + j)
                extras.append(extra)
        if not rows:
            return
        # The runner's persistent buffer (checked at install): the one captured graphs read.
        assert inputs_embeds is not None
        index = torch.tensor(rows, dtype=torch.long).to(inputs_embeds.device, non_blocking=True)
        add = torch.stack(extras).to(device=inputs_embeds.device, dtype=inputs_embeds.dtype, non_blocking=True)
        inputs_embeds.index_add_(0, index, add)

    def _omni_capture(
        self, req_ids: list[str], qsl: list[int], starts: list[int], hidden: torch.Tensor, aux: list[torch.Tensor]
    ) -> None:
        n = qsl[-1]
        parts = [hidden[:n], *(a[:n] for a in aux)]
        spans = {rid: (qsl[i], qsl[i + 1], starts[i]) for i, rid in enumerate(req_ids) if qsl[i + 1] > qsl[i]}
        positions = {}  # shipped with the request's first captured rows
        for rid in spans:
            req = self.omni_io.requests.get(rid)
            if req is not None and req.source_positions is not None:
                positions[rid], req.source_positions = req.source_positions, None
        if hidden.device.type != "cuda":
            self.omni_io.add_capture(CapturedStep(host=torch.stack(parts), done=None, spans=spans, positions=positions))
            return
        # One gather on the compute stream (graph outputs are overwritten by the next replay),
        # then one device-to-host copy on a side stream into pinned memory.
        gathered = torch.stack(parts)
        copy_stream = self._omni_copy_stream
        copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy_stream):
            host = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
            host.copy_(gathered, non_blocking=True)
            done = torch.cuda.Event()
            done.record(copy_stream)
        gathered.record_stream(copy_stream)  # not reused by the allocator before the copy ends
        self.omni_io.add_capture(CapturedStep(host=host, done=done, spans=spans, positions=positions))


def install_runner_hooks(worker: Any, io: StepIO) -> None:
    """Called in the worker (via collective_rpc) after the model is loaded and before its
    first forward: give the runner the mixin; route intermediate layers out of the model."""
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = worker.model_runner
    base = type(runner)
    if not isinstance(runner, GPUModelRunner):  # e.g. the V2 runner: no `_model_forward`
        raise RuntimeError(f"omni_mp's runner hooks need vLLM's V1 model runner, got {base.__qualname__}")
    if io.takes_step_embeds and not (runner.enable_prompt_embeds or runner.supports_mm_inputs):
        # Only then does the model read the persistent inputs_embeds buffer we add into.
        raise ValueError("per-step embeddings need a model that takes inputs_embeds (enable_prompt_embeds)")
    model = runner.get_model()
    if io.capture_layers:
        if runner.use_aux_hidden_state_outputs:
            raise ValueError("hidden_states.layers cannot be combined with EAGLE-3 speculative decoding")
        if not supports_eagle3(model):
            raise ValueError(
                f"hidden_states.layers: {type(model).__name__} does not expose intermediate layers "
                "(vLLM's SupportsEagle3 aux hidden states); stream the last layer only"
            )
        num_layers = int(runner.model_config.hf_text_config.num_hidden_layers)
        bad = [k for k in io.capture_layers if not 0 <= k < num_layers]
        if bad:
            raise ValueError(
                f"hidden_states.layers: {bad} not intermediate layers (0..{num_layers - 1}; "
                f"{num_layers} = the last layer, always included)"
            )
        model.set_aux_hidden_state_layers(tuple(io.capture_layers))
        runner.use_aux_hidden_state_outputs = True  # the runner and its dummy runs unpack (hidden, aux)
    runner.__class__ = type(f"Omni{base.__name__}", (OmniRunnerMixin, base), {})
    runner.omni_io = io
    runner._omni_prepare = getattr(model, "omni_prepare_step", None)
    runner._omni_copy_stream = torch.cuda.Stream() if torch.cuda.is_available() and io.capturing else None


def engine_core_cls(io: StepIO) -> type:
    """vLLM's EngineCore, installing the runner hooks right after the model loads: before the
    memory profile's first forward compiles the model and before CUDA graphs are captured."""
    from vllm.v1.engine.core import EngineCore

    def _initialize_kv_caches(self: Any, vllm_config: Any) -> Any:
        self.model_executor.collective_rpc(install_runner_hooks, args=(io,))
        return EngineCore._initialize_kv_caches(self, vllm_config)

    return type("OmniEngineCore", (EngineCore,), {"_initialize_kv_caches": _initialize_kv_caches})


def capped_cache_manager_cls(io: StepIO, base: type) -> type:
    """A subclass of vLLM's KVCacheManager whose prefix-cache hit for a request with
    `rows_from` > 0 ends at or below that position (whole blocks; vLLM's own limit, the last
    token, still holds), so that the runner computes, and captures, every row read from there."""

    def get_computed_blocks(self: Any, request: Any) -> tuple[Any, int]:
        req = io.requests.get(request.request_id)
        if req is None or req.rows_from <= 0 or not self.enable_caching or request.skip_reading_prefix_cache:
            return base.get_computed_blocks(self, request)
        reach = min(request.num_tokens - 1, req.rows_from)
        blocks, hit = self.coordinator.find_longest_cache_hit(request.block_hashes, reach)
        return self.create_kv_cache_blocks(blocks), hit

    return type(f"OmniCapped{base.__name__}", (base,), {"get_computed_blocks": get_computed_blocks})


def gated_scheduler_cls(io: StepIO, base: type) -> type:
    """A subclass of the scheduler `base` that skips, for one `schedule()`, every running
    request whose next decode step's extra embedding has not arrived. Held requests stay
    running and keep their slot: the running-request limit (`max_num_seqs`) counts them, so no
    more requests are admitted than the runner has room for."""

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        held = [r for r in self.running if not io.decode_ready(r.request_id, r.num_computed_tokens)]
        if not held:
            return base.schedule(self, *args, **kwargs)
        order = {id(r): i for i, r in enumerate(self.running)}
        held_ids = {id(r) for r in held}
        self.running = [r for r in self.running if id(r) not in held_ids]
        limit = self.max_num_running_reqs
        self.max_num_running_reqs = limit - len(held)
        try:
            return base.schedule(self, *args, **kwargs)
        finally:
            self.max_num_running_reqs = limit
            kept = [r for r in self.running if id(r) in order]
            new = [r for r in self.running if id(r) not in order]
            self.running = sorted(kept + held, key=lambda r: order[id(r)]) + new

    return type(f"OmniGated{base.__name__}", (base,), {"schedule": schedule})


@contextlib.contextmanager
def env_overrides(values: dict[str, str]) -> Iterator[None]:
    """Set vLLM environment switches while an engine is configured and built, then restore
    them (an embedding process keeps its own settings). vLLM reads these while it builds the
    config, the executor and the model runner, all inside this block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_engine_core(
    engine_args: Any,
    core_cls: type | None = None,
    env: dict[str, str] | None = None,
    configure: Callable[[Any], None] | None = None,
) -> Any:
    """An `EngineCore` in this process for `EngineArgs` (vLLM 0.25.0), with `env` set while it
    is configured and built; `configure(vllm_config)` edits the resolved config before the core
    is built from it."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor import Executor

    with env_overrides(env or {}):
        vllm_config = engine_args.create_engine_config()
        if configure is not None:
            configure(vllm_config)
        core = (core_cls or EngineCore)(vllm_config, Executor.get_class(vllm_config), log_stats=False)
    return core


def hooked_scheduler_cls(io: StepIO, base: type) -> type:
    """The scheduler `base` with the hooks `io` needs: the gate (`gated_scheduler_cls`) for
    per-step embeddings; for captured rows, a KV cache manager whose prefix-cache hits stop at
    each request's first read row (`capped_cache_manager_cls`; the scheduler builds its
    manager in `__init__`, so the instance's class is swapped right after)."""
    cls = gated_scheduler_cls(io, base) if io.takes_step_embeds else base
    if not io.capturing:
        return cls

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)
        manager = self.kv_cache_manager
        manager.__class__ = capped_cache_manager_cls(io, type(manager))

    return type(f"OmniCapped{cls.__name__}", (cls,), {"__init__": __init__})


def install_scheduler(io: StepIO) -> Callable[[Any], None]:
    """A `build_engine_core` `configure` that makes the resolved scheduler class the hooked one
    (`hooked_scheduler_cls`). vLLM decides async scheduling while it resolves the config (on by
    default where the executor supports it, off on the CPU platform) and picks `AsyncScheduler`
    or `Scheduler` from that: the gate subclasses whichever it picked (or a configured class).
    Async scheduling holds no hazard for the gate: a step is scheduled (and its extra rows
    checked) for the request's `num_computed_tokens` after the step in flight, and the runner
    adds rows by the positions the step computes, so the gate and the rows agree either way."""

    def configure(vllm_config: Any) -> None:
        sched = vllm_config.scheduler_config
        sched.scheduler_cls = hooked_scheduler_cls(io, sched.get_scheduler_cls())

    return configure


def _input_processor_cls() -> type:
    """vLLM's InputProcessor, its prompt-length check raising ContextLengthError (the lengths
    as numbers, not vLLM's message) for a decoder prompt that leaves no room for an output
    token; `_validate_prompt_len(prompt_len, prompt_type)` is where 0.25.0 checks it, after
    expanding the media."""
    from vllm.v1.engine.input_processor import InputProcessor

    class _InputProcessor(InputProcessor):  # type: ignore[misc, valid-type]
        def _validate_prompt_len(self, prompt_len: int, prompt_type: str) -> None:
            limit = self.model_config.max_model_len
            if prompt_type == "decoder" and not self.skip_prompt_length_check and prompt_len >= limit:
                raise ContextLengthError(prompt_len, limit)
            super()._validate_prompt_len(prompt_len, prompt_type)

    return _InputProcessor


class RequestInputs:
    """vLLM 0.25.0's `InputProcessor` for an engine core: prompts (token ids, embeddings, media)
    and sampling params -> the `EngineCoreRequest` that `CoreDriver.add` hands to the scheduler,
    validated and processed by vLLM's own code (its multimodal processors included)."""

    def __init__(self, core: Any) -> None:
        self._processor = _input_processor_cls()(core.vllm_config)
        self._tasks = core.get_supported_tasks()

    @property
    def tokenizer(self) -> Any | None:
        return self._processor.tokenizer

    def process(self, request_id: str, prompt: Any, params: Any) -> Any:
        return self._processor.process_inputs(request_id, prompt, params, self._tasks, arrival_time=time.time())


class CoreDriver:
    """What a stage engine does with vLLM 0.25.0's `EngineCore` and its scheduler: the only
    place that reads their state. `io` (hooked stages): requests held back by the gated
    scheduler do not count as steppable work."""

    def __init__(self, core: Any, io: StepIO | None = None) -> None:
        self.core = core
        self.io = io

    @property
    def vllm_config(self) -> Any:
        return self.core.vllm_config

    def add(self, request: Any) -> None:
        """Hand a processed `EngineCoreRequest` to the scheduler."""
        req, wave = self.core.preprocess_add_request(request)
        self.core.add_request(req, wave)

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.core.abort_requests(request_ids)

    def can_step(self) -> bool:
        """Work that a step can advance now (not only requests waiting for step embeddings)."""
        sched = self.core.scheduler
        if self.core.batch_queue:  # a batch in flight (async scheduling): its outputs are due
            return True
        if not sched.has_requests():
            return False
        io = self.io
        gated = io is not None and any(r.step_embeds is not None for r in io.requests.values())
        if not gated or sched.get_num_unfinished_requests() > len(sched.running):
            return True
        return any(io.decode_ready(r.request_id, r.num_computed_tokens) for r in sched.running)

    def step(self) -> tuple[list[Any], bool]:
        """One engine step; its `EngineCoreOutput`s and whether anything was computed. With async
        scheduling (vLLM's default on CUDA) a step launches the next batch before taking the
        outputs of the previous one, so the GPU never waits for the host."""
        outputs, executed = self.core.step_fn()
        self.core.post_step(executed)
        return [out for per_client in (outputs or {}).values() for out in per_client.outputs], executed

    def shutdown(self) -> None:
        self.core.shutdown()

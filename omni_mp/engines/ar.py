"""An autoregressive stage engine: vLLM 0.25.0's `EngineCore`, run in the stage process itself.

The stage loop owns the engine: it prepares and adds requests, calls `step()` and forwards
each step's new tokens and, when configured, the hidden-state rows the step computed (in
`StepOutput.hidden`). There is no engine-core client and no extra engine process; with
`VLLM_ENABLE_V1_MULTIPROCESSING=0` (set by the coordinator for every stage) the platform
keeps the `UniProcExecutor`, so the model worker runs in this process too: nothing to
orphan, and the per-step hooks of `vllm_hooks` share memory with the engine. Everything that
reads vLLM's engine-core or scheduler state is in `vllm_hooks` (`CoreDriver`).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from omni_mp.engines.base import EngineInputError, Extension, PromptIds, StageInput, StepOutput
from omni_mp.engines.rows import RowStream
from omni_mp.engines.vllm_hooks import (
    CapturedRows,
    CoreDriver,
    HookedRequest,
    RequestInputs,
    StepIO,
    build_engine_core,
    engine_core_cls,
    install_scheduler,
)
from omni_mp.engines.vllm_hooks_sampling import SuppressTokens, suppress_args
from omni_mp.engines.vllm_hooks_warmup import MoeWarmup, warm_up_moe_kernels, warm_up_sampler_kernels
from omni_mp.wire.messages import HiddenRows, LayerRows, MRopePositions, SamplingParamsMsg

log = logging.getLogger("omni_mp.stage")


@dataclass(frozen=True, slots=True)
class EngineFeatures:
    """What the stage needs beyond plain token generation (see vllm_hooks)."""

    hidden_states: bool = False  # capture the last layer's hidden states of every computed token
    hidden_layers: tuple[int, ...] = ()  # and these HF-numbered intermediate layers
    prompt_embeds: bool = False  # prompts may come as embeddings
    step_embeds: bool = False  # decode steps may add per-step extra embeddings
    # Compile the fused-MoE kernel variants of every prefill size before serving
    # (vllm_hooks_warmup); None: on a GPU.
    warm_moe_kernels: bool | None = None


@dataclass(slots=True)
class PreparedAR:
    """A request processed by vLLM's input processor, with what the runner hooks need."""

    request_id: str
    request: Any  # vLLM's EngineCoreRequest
    prompt: PromptIds
    hooked: HookedRequest | None
    companions: list[PreparedAR] = field(default_factory=list)  # StageInput.companions, prepared
    forced: list[int] = field(default_factory=list)  # StageInput.forced_reply but its last id


@dataclass
class _Forced:
    """A started request's given reply (StageInput.forced_reply): what its first output reports."""

    ids: list[int]  # reported as output tokens before the sampled one
    prompt_len: int  # the prompt as reported: its M-RoPE positions are cut to it


COMPANION_SEP = "#"  # vLLM ids of companion sequences: "<request id>#<k>" (never a client id)


@dataclass
class _Group:
    """A request and its companion sequences (prefill only): their outputs are held until all
    have finished, then go out as the request's one output, rows in member order."""

    members: list[str]
    hidden: dict[str, list[HiddenRows]]
    done: set[str] = field(default_factory=set)
    token_ids: list[int] = field(default_factory=list)
    reason: str | None = None


class AREngine:
    def __init__(self, model: str, engine_args: dict[str, Any], features: EngineFeatures = EngineFeatures()) -> None:
        from vllm.engine.arg_utils import EngineArgs

        self.features = features
        self._executed = False  # whether the last step computed anything (`step_progress`)
        self.io = StepIO(
            capturing=features.hidden_states,
            capture_layers=list(features.hidden_layers),
            step_embeds=features.step_embeds,
        )
        hooked = self.io.capturing or features.step_embeds  # needs vllm_hooks in the model runner
        self.hooked = hooked
        args = dict(engine_args)
        if self.io.capturing:
            # A prefix-cache hit skips computing the cached tokens, so their hidden rows would be
            # missing: off unless the stage's engine_args turn it on, and then read in full by the
            # requests whose rows nobody reads (StageInput.rows_wanted; e.g. text-only answers
            # of a thinker whose talker does not run for them), and only below the first row
            # read by the others (`_rows_from`: vllm_hooks caps the cache hit there).
            args.setdefault("enable_prefix_caching", False)
        if features.prompt_embeds or features.step_embeds:
            # Step embeddings are added into the persistent inputs_embeds buffer (vllm_hooks),
            # which the model reads only when prompt embeddings are enabled.
            args["enable_prompt_embeds"] = True
        # The scheduler vLLM resolves, async (CUDA's default: the host prepares step N+1 while the
        # GPU runs step N) or not, subclassed: the gate holds back decode steps whose extra row has
        # not arrived; a capturing stage's prefix-cache hits stop at a request's first read row.
        configure = install_scheduler(self.io) if hooked else None
        # Suppressed ids through our logits processor, not a per-request allowed_token_ids list
        # of the rest of the vocabulary (~10 ms of host time per request: vllm_hooks_sampling).
        # Only where the runner is V1 anyway (hooked): vLLM moves a stage with a custom logits
        # processor from its V2 runner to V1. Speculative decoding refuses custom processors.
        self.suppress_in_runner = hooked and not args.get("speculative_config")
        if self.suppress_in_runner:
            args["logits_processors"] = [*(args.get("logits_processors") or []), SuppressTokens]
        # Requests are prepared on another thread than the one that adds them (omni_mp.stage):
        # vLLM's multimodal processor cache assumes the engine receives every processed item in
        # order, which a request failing or aborted between the two would break.
        args["mm_processor_cache_gb"] = 0  # a config asking for more is refused (omni_mp.config)
        # The hooks override the V1 runner's `_model_forward`; vLLM 0.25.0 picks its V2 runner
        # on CUDA by default, which has no such override point.
        env = {"VLLM_USE_V2_MODEL_RUNNER": "0"} if hooked else {}
        core = build_engine_core(
            EngineArgs(model=model, **args), engine_core_cls(self.io) if hooked else None, env, configure
        )
        self.driver = CoreDriver(core, self.io if hooked else None)
        vllm_config = core.vllm_config
        if hooked and vllm_config.parallel_config.world_size != 1:
            self.driver.shutdown()
            raise ValueError("hidden-state output and step embeddings need a single-worker stage (no TP/PP)")
        self.moe_warmup: MoeWarmup | None = None
        self.warmup_note: str | None = None  # what the start-up warm-up did, for the stage's Ready line
        self._warm_up(core, features)
        self.vllm_config = vllm_config
        self._inputs = RequestInputs(core)
        # The engine thread decodes with its own copy: a fast tokenizer must not be used by
        # two threads at once, and `tokenize`/`prepare` run on the preparing thread.
        self._decoder = None if self._inputs.tokenizer is None else copy.deepcopy(self._inputs.tokenizer)
        # The width of the model's input embeddings (prompt and step embeddings): its hidden
        # size, unless its config sets vLLM's `projection_size` (e.g. a model that projects its
        # inputs itself; vLLM 0.25.0 sizes the runner's inputs_embeds buffer by this).
        self.inputs_embeds_size: int = vllm_config.model_config.get_inputs_embeds_size()
        self.vocab_size: int = vllm_config.model_config.get_vocab_size()
        self.uses_mrope: bool = bool(vllm_config.model_config.uses_mrope)
        self.dtype: torch.dtype = vllm_config.model_config.dtype
        self._groups: dict[str, _Group] = {}  # requests with companion sequences
        self._forced: dict[str, _Forced] = {}  # started requests with a given reply not yet reported
        self._member_of: dict[str, str] = {}  # a group member's vLLM id -> its request id

    def _warm_up(self, core: Any, features: EngineFeatures) -> None:
        """Compile before serving the Triton kernel variants requests would otherwise compile
        inside their steps (vllm_hooks_warmup): the fused MoE's (`warm_moe_kernels`) and, on
        a GPU, the sampler's. Speed-ups only: a failure is logged and the stage serves."""
        notes: list[str] = []
        cuda = core.vllm_config.device_config.device.type == "cuda"
        warm_moe = cuda if features.warm_moe_kernels is None else features.warm_moe_kernels
        if warm_moe:
            try:
                self.moe_warmup = warm_up_moe_kernels(core)
            except Exception as err:  # noqa: BLE001 - a speed-up only: the stage serves without it
                log.exception("fused-MoE warm-up failed; serving without it (first prefills may compile kernels)")
                notes.append(f"fused-MoE warm-up failed ({f'{type(err).__name__}: {err}'[:300]}); serving without it")
        if self.moe_warmup is not None and self.moe_warmup.sizes:
            w = self.moe_warmup
            log.info(
                "fused-MoE kernels warmed at %d token counts %s (%d layer shapes) in %.1f s",
                len(w.sizes), w.sizes, w.layers, w.seconds,
            )  # fmt: skip
            notes.append(f"fused-MoE kernels warmed at {len(w.sizes)} token counts in {w.seconds:.1f}s")
        if cuda:
            try:
                sw = warm_up_sampler_kernels(core)
            except Exception as err:  # noqa: BLE001 - a speed-up only
                log.exception("sampler warm-up failed; serving without it (first batches may compile kernels)")
                notes.append(f"sampler warm-up failed ({f'{type(err).__name__}: {err}'[:300]}); serving without it")
            else:
                if sw.batches:
                    log.info("sampler kernels warmed at batch sizes %s in %.1f s", sw.batches, sw.seconds)
                    notes.append(f"sampler kernels warmed at batch sizes {sw.batches} in {sw.seconds:.1f}s")
        self.warmup_note = "; ".join(notes) or None

    @property
    def tokenizer(self) -> Any | None:
        return self._inputs.tokenizer

    def tokenize(self, text: str, *, literal: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise EngineInputError("this stage has no tokenizer (skip_tokenizer_init): send prompt_token_ids")
        if literal:
            return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        return list(self.tokenizer.encode(text))

    def decode(self, token_ids: list[int]) -> str | None:
        return None if self._decoder is None else self._decoder.decode(token_ids)

    @property
    def speakers(self) -> frozenset[str] | None:
        return None  # an AR stage's voice, if any, is its processor's business

    def to_vllm_sampling(self, p: SamplingParamsMsg, only: list[int] | None = None) -> Any:
        """vLLM's sampling parameters; `only`: the ids that may be sampled (all others never)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        allowed, extra = only, None
        if p.suppress_token_ids:
            suppressed = set(p.suppress_token_ids)
            outside = sorted(t for t in suppressed if t >= self.vocab_size)
            if outside:
                raise EngineInputError(f"suppress_token_ids: {outside[:8]} outside the vocabulary of {self.vocab_size}")
            # -inf before penalties and sampling: exactly transformers' suppress_tokens (a logit
            # bias would not be exact). vLLM's allowed_token_ids does it too, from the list of
            # every other id.
            if self.suppress_in_runner:
                extra = suppress_args(suppressed)
            else:
                allowed = [t for t in range(self.vocab_size) if t not in suppressed]
        structured = None if p.structural_tag is None else StructuredOutputsParams(structural_tag=p.structural_tag)
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
            extra_args=extra,
            structured_outputs=structured,
            detokenize=False,  # the stage decodes final text itself, once
            # Built for one request and never reused: vLLM need not deep-copy it (3.9 ms with an
            # 8k-id allowed list).
            skip_clone=True,
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

    def _vllm_prompt(self, inp: StageInput) -> Any:
        """The prompt in vLLM's input form. `prompt_embeds` with `prompt_token_ids`: an
        embeddings prompt whose ids only count for repetition penalties. `prompt_text` (with
        `multi_modal` data) is tokenized and its media placeholders expanded by vLLM."""
        from vllm.inputs.engine import embeds_input, tokens_input

        if inp.prompt_embeds is not None:
            if not self.features.prompt_embeds:
                raise EngineInputError("this stage does not take prompt embeddings")
            embeds = self._check_embeds("prompt_embeds", inp.prompt_embeds)
            ids = inp.prompt_token_ids
            if ids is None:
                return embeds_input(embeds)
            if len(ids) != embeds.shape[0]:
                raise EngineInputError(
                    f"prompt_token_ids with prompt_embeds: {len(ids)} ids for {embeds.shape[0]} rows"
                )
            # mixed mode, every position an embedding: the ids are bookkeeping only
            return embeds_input(embeds, prompt_token_ids=list(ids), is_token_ids=[False] * len(ids))
        if inp.prompt_token_ids is not None:
            return tokens_input(inp.prompt_token_ids)
        if inp.prompt_text is not None:
            prompt: dict[str, Any] = {"prompt": inp.prompt_text}
            if inp.multi_modal:
                prompt["multi_modal_data"] = inp.multi_modal
            return prompt
        raise EngineInputError("a request needs prompt_token_ids, prompt_embeds or a prompt text")

    def prepare(
        self, request_id: str, sampling: SamplingParamsMsg, stage_input: StageInput, speaker: str | None = None
    ) -> PreparedAR:
        """Validate and process with vLLM's own input processor (media included). `positions`:
        M-RoPE positions of the prompt's first rows and the offset of every later one. With
        `step_embeds`, decode step k adds extra row k to its input embedding and waits for it."""
        forced: list[int] = []
        only = None
        if stage_input.forced_reply:
            only = stage_input.forced_reply[-1:]
            stage_input, sampling, forced = _given_reply(stage_input, sampling)
        prompt = self._vllm_prompt(stage_input)
        if (stage_input.step_embeds or stage_input.step_rows is not None) and not self.features.step_embeds:
            raise EngineInputError("this stage does not take per-step embeddings")
        if stage_input.stop_token_ids or stage_input.suppress_token_ids:
            sampling = msgspec.structs.replace(
                sampling,
                stop_token_ids=sorted({*sampling.stop_token_ids, *stage_input.stop_token_ids}),
                suppress_token_ids=sorted({*sampling.suppress_token_ids, *stage_input.suppress_token_ids}),
            )
        try:
            params = self.to_vllm_sampling(sampling, only)
            req = self._inputs.process(request_id, prompt, params)
        except EngineInputError:
            raise
        except (ValueError, TypeError, KeyError) as err:  # vLLM's processors raise all three on bad media
            raise EngineInputError(str(err)) from err
        prompt_len = req.prompt_embeds.shape[0] if req.prompt_embeds is not None else len(req.prompt_token_ids or [])
        ids = None if req.prompt_token_ids is None else list(req.prompt_token_ids)
        positions = None if stage_input.positions is None else self._check_positions(stage_input.positions, prompt_len)
        hooked = None
        if self.hooked:
            rows_from = self._rows_from(req, stage_input, prompt_len)
            hooked = HookedRequest(
                prompt_len=prompt_len,
                positions=positions,
                rows_wanted=stage_input.rows_wanted,
                rows_from=rows_from,
                hidden_next=rows_from,
                step_embeds=self._step_stream(stage_input),
            )
        companions = []
        if stage_input.companions:
            # Each companion is a sequence of its own whose hidden rows follow the prompt's:
            # only for prefill (one token each), where rows and sequences cannot interleave.
            if sampling.max_tokens != 1 or not self.io.capturing or stage_input.step_embeds:
                raise EngineInputError(
                    "companion prompts: only on a stage that emits hidden states, with max_tokens 1 (prefill only)"
                )
            companions = [
                self.prepare(f"{request_id}{COMPANION_SEP}{k}", sampling, c, speaker)
                for k, c in enumerate(stage_input.companions, start=1)
            ]
        if forced:  # the prompt as reported: the given reply's ids count as output
            assert ids is not None
            reported = PromptIds(prompt_len - len(forced), ids[: -len(forced)])
            return PreparedAR(request_id, req, reported, hooked, forced=forced)
        return PreparedAR(request_id, req, PromptIds(prompt_len, ids), hooked, companions)

    def _step_stream(self, inp: StageInput) -> RowStream | None:
        """A request's per-step rows: those given with it (`step_rows`), then what its upstream
        streams in (`step_embeds`) or, once closed, `step_fill` (zeros when not given)."""
        if not (inp.step_embeds or inp.step_fill is not None or inp.step_rows is not None):
            return None
        fill = torch.zeros(self.inputs_embeds_size) if inp.step_fill is None else inp.step_fill
        stream = RowStream(fill=self._check_embeds("step embeddings", fill[None])[0])
        if inp.step_rows is not None:
            stream.append(self._check_embeds("step_rows", inp.step_rows))
        if not inp.step_embeds:  # nothing streams in: every step past the given rows takes the fill
            stream.close()
        return stream

    def _rows_from(self, req: Any, stage_input: StageInput, prompt_len: int) -> int:
        """The first position whose rows a reader of this request reads (0: all of them), and
        the prefix cache's reach for it: only below that position (see __init__). Readers of
        media rows only (`media_rows_only`) read from the first media placeholder (vLLM's
        placeholder ranges of the processed prompt), or only past the prompt when it has none."""
        if not (self.io.capturing and stage_input.rows_wanted):
            return 0  # nobody reads its rows: the cache is read as usual and they are dropped
        rows_from = 0
        if stage_input.media_rows_only:
            rows_from = min((f.mm_position.offset for f in req.mm_features or ()), default=prompt_len)
        if rows_from == 0:
            req.sampling_params.skip_reading_prefix_cache = True  # every row is computed
        return rows_from

    def check_params(self, params: dict[str, Any] | None) -> None:
        return None  # an AR stage's model parameters are its prompt format's (checked when prepared)

    def add(self, prepared: PreparedAR) -> PromptIds:  # type: ignore[override]
        for p in [prepared, *prepared.companions]:
            if p.hooked is not None:
                self.io.requests[p.request_id] = p.hooked
            self.driver.add(p.request)
        if prepared.forced:
            self._forced[prepared.request_id] = _Forced(prepared.forced, prepared.prompt.length)
        if prepared.companions:
            members = [prepared.request_id, *(c.request_id for c in prepared.companions)]
            self._groups[prepared.request_id] = _Group(members, {m: [] for m in members})
            self._member_of.update((m, prepared.request_id) for m in members)
        return prepared.prompt

    def _end_group(self, request_id: str) -> list[str]:
        """Forget a request's group; returns the vLLM ids of its sequences."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return [request_id]
        for m in group.members:
            self._member_of.pop(m, None)
        return group.members

    def _merge_groups(self, outputs: list[StepOutput]) -> list[StepOutput]:
        """Outputs of grouped sequences are held until the whole group has finished, then
        become one output of the request: the prompt's tokens, and every member's rows."""
        merged: list[StepOutput] = []
        for out in outputs:
            rid = self._member_of.get(out.request_id)
            if rid is None:
                merged.append(out)
                continue
            group = self._groups[rid]
            if out.hidden is not None:
                group.hidden[out.request_id].append(out.hidden)
            if out.request_id == rid:
                group.token_ids.extend(out.new_token_ids)
                group.reason = out.finish_reason if out.finished else group.reason
            if out.finished:
                group.done.add(out.request_id)
            if len(group.done) < len(group.members):
                continue
            self._end_group(rid)
            rows = [h for m in group.members for h in group.hidden[m] if h.last is not None]
            first = group.hidden[rid][0] if group.hidden[rid] else None
            hidden = None
            if rows:
                hidden = HiddenRows(
                    start=0,
                    last=_cat([h.last for h in rows]),  # type: ignore[misc]
                    layers=[
                        LayerRows(lr.layer, _cat([h.layers[i].rows for h in rows]))
                        for i, lr in enumerate(rows[0].layers)
                    ],
                    mrope=first.mrope if first is not None else None,
                )
            merged.append(StepOutput(rid, group.token_ids, True, group.reason, hidden=hidden))
        return merged

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

    def extend(self, request_id: str, extension: Extension) -> None:
        if extension.input_ids:
            raise EngineInputError("an AR stage takes its whole prompt at once")
        req = self.io.requests.get(request_id)
        if req is None:
            return  # finished or aborted meanwhile
        if req.step_embeds is None:
            if extension.step_rows is not None:
                raise EngineInputError("this request takes no per-step embeddings")
            return
        if extension.step_rows is not None:
            req.step_embeds.append(self._check_embeds("step embeddings", extension.step_rows))
        if extension.closed:
            req.step_embeds.close()

    def take_failed(self) -> dict[str, str]:
        """Requests the runner could not serve as asked, with the reason (each reported once)."""
        failed, self.io.failed = self.io.failed, {}
        by_request: dict[str, str] = {}
        for vid, reason in failed.items():  # a companion's failure is its request's (the loop aborts it)
            by_request.setdefault(self._member_of.get(vid, vid), reason)
        return by_request

    def abort(self, request_ids: list[str]) -> None:
        ids = [vid for rid in request_ids for vid in self._end_group(rid)]
        for rid in request_ids:
            self._forced.pop(rid, None)
        self.driver.abort(ids)
        for vid in ids:
            self.io.release(vid)

    def can_step(self) -> bool:
        return self.driver.can_step()

    def step(self) -> tuple[list[StepOutput], bool]:
        """One engine step over the whole batch; also says whether any token was computed.
        Hidden-state rows come out with the step whose host copy completed them (a request
        can have rows and no new token; a finished one has all its rows)."""
        outputs, executed = self.driver.step()
        self._executed = executed
        finished = {out.request_id for out in outputs if out.finished}
        captured = self.io.collect(finished) if self.io.capturing else {}
        result: list[StepOutput] = []
        by_request = {out.request_id: out for out in outputs}
        for rid in dict.fromkeys([*by_request, *captured]):
            out = by_request.get(rid)
            req = self.io.requests.get(rid)
            new_ids = [] if out is None else list(out.new_token_ids)
            if req is not None:
                req.num_output += len(new_ids)
            hidden = None
            if rid in captured and req is not None and req.rows_wanted:
                # A finished request has states for its prompt and all generated tokens but the last.
                limit = req.prompt_len + req.num_output - 1 if rid in finished else None
                hidden = self._hidden_rows(rid, req, captured[rid], limit)
            if out is None and hidden is None:
                continue
            reason = None if out is None or out.finish_reason is None else str(out.finish_reason)
            if rid in self._forced:
                new_ids, hidden = self._report_given(rid, new_ids, hidden)
            stats = None if out is None else out.prefill_stats  # on the first output of a request
            cached = 0 if stats is None else int(stats.num_cached_tokens)
            result.append(StepOutput(rid, new_ids, rid in finished, reason, hidden=hidden, cached_tokens=cached))
        for rid in finished:
            self.io.release(rid)
        return (self._merge_groups(result) if self._groups else result), executed

    def step_progress(self) -> tuple[int, int]:
        return (1, 1) if self._executed else (0, 0)  # one forward pass a step

    def _report_given(
        self, rid: str, new_ids: list[int], hidden: HiddenRows | None
    ) -> tuple[list[int], HiddenRows | None]:
        """A request with a given reply, as if it had generated it: its first output reports the
        reply's ids before any sampled one, and its M-RoPE positions are the reported prompt's
        (the reply's positions are text positions, so the later-offset `delta` is the same)."""
        given = self._forced[rid]
        if hidden is not None and hidden.mrope is not None:
            mrope = MRopePositions(hidden.mrope.positions[:, : given.prompt_len], hidden.mrope.delta)
            hidden = HiddenRows(start=hidden.start, last=hidden.last, layers=hidden.layers, mrope=mrope)
        del self._forced[rid]
        return [*given.ids, *new_ids], hidden

    def _hidden_rows(
        self, rid: str, req: HookedRequest, captured: list[CapturedRows], limit: int | None
    ) -> HiddenRows | None:
        """The new rows of a request, in position order, below `limit`. Rows recomputed after
        preemption were handed out already and are skipped; a gap fails the request."""
        last: list[torch.Tensor] = []
        layers: dict[int, list[torch.Tensor]] = {k: [] for k in self.io.capture_layers}
        start = req.hidden_next
        mrope = None
        for rows in captured:
            if rows.positions is not None:  # with the prompt's first rows, and goes with them
                mrope = MRopePositions(rows.positions[0], rows.positions[1])
            end = rows.start + rows.last.shape[0] if limit is None else min(limit, rows.start + rows.last.shape[0])
            skip = max(0, req.hidden_next - rows.start)
            if rows.start + skip >= end:
                continue
            if rows.start + skip != req.hidden_next:
                self.io.failed.setdefault(
                    rid, f"hidden states: rows from {rows.start} after {req.hidden_next} rows (a gap)"
                )
                return None
            last.append(rows.last[skip : end - rows.start])
            for k in layers:
                layers[k].append(rows.layers[k][skip : end - rows.start])
            req.hidden_next = end
        if not last:
            if mrope is None:
                return None
            # The positions still go out (with no rows): the consumer needs them before row 0.
            first = captured[0]
            last = [first.last[:0]]
            layers = {k: [first.layers[k][:0]] for k in layers}
        return HiddenRows(
            start=start,
            last=_cat(last),
            layers=[LayerRows(k, _cat(parts)) for k, parts in layers.items()],
            mrope=mrope,
        )

    def shutdown(self) -> None:
        self.driver.shutdown()


def _given_reply(inp: StageInput, sampling: SamplingParamsMsg) -> tuple[StageInput, SamplingParamsMsg, list[int]]:
    """A prompt with a given reply -> the prompt vLLM runs (the reply but its last id appended),
    one step that can only sample that last id (the turn's end), and the ids reported as output."""
    if inp.prompt_token_ids is None or inp.prompt_embeds is not None or inp.prompt_text is not None:
        raise EngineInputError("forced_reply: only after a token prompt")
    if inp.companions or inp.step_embeds or inp.step_rows is not None or inp.multi_modal or inp.positions is not None:
        raise EngineInputError("forced_reply: not with companions, step embeddings, media or positions")
    *given, end = inp.forced_reply
    inp = msgspec.structs.replace(inp, prompt_token_ids=[*inp.prompt_token_ids, *given], forced_reply=[])
    sampling = msgspec.structs.replace(
        sampling, max_tokens=1, min_tokens=0, temperature=0.0, ignore_eos=False, stop_token_ids=[end],
        suppress_token_ids=[],
    )  # fmt: skip
    return inp, sampling, given


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)

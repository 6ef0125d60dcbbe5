"""The boundary between the stage loop and an engine, whatever its kind (AR or diffusion).

Both kinds are vLLM `EngineCore`s in the stage process. The loop prepares a request
(`prepare`: input checks and vLLM's input processing, on any thread), adds it (`add`, on the
engine thread), extends a started request with what its upstream streams in (`extend`),
steps while `can_step()`, forwards each step's outputs (tokens, hidden rows, audio), aborts,
and fails the requests the engine could not serve (`take_failed`). The loop calls nothing
else: one request lifecycle (abort, deadline, errors, streaming, restart) for both kinds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import torch

from omni_mp.wire.messages import AdditionalInformation, HiddenRows, SamplingParamsMsg


class StageInput(msgspec.Struct):
    """A stage's prompt and how the engine should treat it (what a processor or an entry
    stage's prompt format makes; the engine's `prepare` takes it whole).

    `prompt_token_ids` alone: a token prompt. `prompt_embeds` alone: embeddings [n, width] of
    the stage's model. Both: embeddings, with `prompt_token_ids` as the ids the sampler counts
    for repetition penalties (vLLM's mixed prompt; nothing is embedded from them)."""

    prompt_token_ids: list[int] | None = None
    prompt_embeds: torch.Tensor | None = None
    prompt_text: str | None = None  # entry stages: text the engine tokenizes with its media
    multi_modal: dict[str, list[Any]] | None = None  # vLLM multi_modal_data of an entry stage
    positions: tuple[torch.Tensor, int] | None = None  # M-RoPE prompt positions [3, p] and later offset
    # Stages fed per-step embeddings: decode steps take extra rows (`Extension.step_rows`);
    # `step_fill` is the row of every step after the stream's last one (None: zeros); given
    # without `step_embeds`, every decode step takes it (no rows stream in). `step_rows`: the
    # first decode steps' rows, known when the request starts (an entry stage builds them, as
    # Qwen3-TTS's text fed a token per frame); without `step_embeds` no more follow them.
    step_embeds: bool = False
    step_fill: torch.Tensor | None = None
    step_rows: torch.Tensor | None = None  # [k, width]: decode steps 0..k-1
    stop_token_ids: list[int] = []  # added to the request's sampling parameters
    # Prompts of the same request run beside this one, each as its own sequence (AR: prefill
    # only; their hidden rows follow this prompt's rows in the request's one row stream; e.g.
    # an image's negative prompt). A diffusion model may take them as extra conditioning.
    companions: list[StageInput] = []
    params: dict[str, Any] | None = None  # the client's model parameters (Submit.params)
    suppress_token_ids: list[int] = []  # never sampled
    # A reply given, not generated (Submit.forced_reply; AR token prompts only): its ids but
    # the last are prefilled after the prompt and reported as the request's first output
    # tokens, as if generated; the last (the turn's end) is the one token sampled, the only
    # one allowed. The request's hidden rows are then exactly a generated reply's.
    forced_reply: list[int] = []
    # Whether anything reads this request's hidden rows (a downstream stage or the client:
    # StageRequest.rows_wanted). A stage that captures rows computes such a request's whole
    # prompt (a prefix-cache hit would skip the rows of the cached positions); one nobody
    # reads may start from the prefix cache, and its rows are dropped.
    rows_wanted: bool = True
    # Its readers read prompt rows only at media placeholders (StageRequest.media_rows_only): the
    # prompt is computed from its first media position, below which the prefix cache is read.
    media_rows_only: bool = False
    # An entry stage's named values for the stages downstream, sent on the request's first output
    # chunk (`additional_information`; e.g. Qwen3-TTS in-context cloning's clip codes, which its
    # decoder decodes before the new ones).
    first_chunk_info: dict[str, Any] | None = None
    # Diffusion (codec) stages: the first `context_ids` prompt ids are context only, decoded
    # before the rest and never emitted (the decoder starts from their state).
    context_ids: int = 0


@dataclass(frozen=True, slots=True)
class Extension:
    """More input for a started request, as its upstream streams it: extra embeddings for
    its next decode steps, or more input ids; `closed`: nothing more will come."""

    step_rows: torch.Tensor | None = None  # [k, width]
    input_ids: Sequence[int] = ()
    closed: bool = False


@dataclass(frozen=True, slots=True)
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    info: AdditionalInformation | None = None  # named outputs of the step (diffusion: an audio chunk)
    hidden: HiddenRows | None = None  # hidden-state rows this step completed (stages that emit them)
    cached_tokens: int = 0  # with a request's first output: prompt tokens read from the prefix cache


@dataclass(frozen=True, slots=True)
class PromptIds:
    """A started request's prompt as the engine holds it."""

    length: int
    token_ids: list[int] | None  # None: an embeddings prompt (or a diffusion stage's open input)


class PreparedRequest(Protocol):
    """A request checked and processed by `prepare`, ready for `add` (engine-specific)."""

    request_id: str


class EngineInputError(ValueError):
    """The engine rejected a request's input (the message says what and why)."""


# How a ContextLengthError's message starts: the stage reports it with code `invalid_input` like
# any refused input, and whoever shows it to a client (the HTTP server: a 400 naming the prompt's
# field) tells it apart by this.
CONTEXT_LENGTH_EXCEEDED = "context length exceeded"


class ContextLengthError(EngineInputError):
    """A prompt longer than the model's context, counted as the model sees it (each medium
    expanded to its tokens), with at least one token left for the output."""

    def __init__(self, prompt_len: int, max_model_len: int) -> None:
        super().__init__(
            f"{CONTEXT_LENGTH_EXCEEDED}: the prompt is {prompt_len} tokens (its media expanded), "
            f"the model's context is {max_model_len} (max_model_len), one of them for the answer"
        )
        self.prompt_len, self.max_model_len = prompt_len, max_model_len


class StageEngine(Protocol):
    @property
    def speakers(self) -> frozenset[str] | None:
        """The voices a request may pick (None: this engine does not speak)."""
        ...

    def tokenize(self, text: str, *, literal: bool = False) -> list[int]:
        """Text to prompt ids (safe on any thread). `literal`: a continuation (no special
        tokens added) whose special-token strings stay text. Raises EngineInputError."""
        ...

    def decode(self, token_ids: list[int]) -> str | None: ...

    def prepare(
        self, request_id: str, sampling: SamplingParamsMsg, stage_input: StageInput, speaker: str | None
    ) -> PreparedRequest:
        """Check and process a request's input (media included) without touching the running
        engine: safe on another thread than the engine's. Raises EngineInputError."""
        ...

    def add(self, prepared: PreparedRequest) -> PromptIds:
        """Start a prepared request (engine thread). Raises EngineInputError."""
        ...

    def extend(self, request_id: str, extension: Extension) -> None:
        """More input for a started request (engine thread). Raises EngineInputError."""
        ...

    def check_params(self, params: dict[str, Any] | None) -> None:
        """Refuse a request's model parameters this stage cannot serve (at registration,
        before any stage works on it). Raises EngineInputError."""
        ...

    def abort(self, request_ids: list[str]) -> None: ...

    def can_step(self) -> bool: ...

    def step(self) -> tuple[list[StepOutput], bool]: ...

    def step_progress(self) -> tuple[int, int]:
        """Model steps begun and ended by the last `step()`: (1, 1) when it computed anything,
        unless the engine runs a model step over several engine steps (a diffusion step in
        parts); one per batch group of a diffusion engine. For the step timeline."""
        ...

    def take_failed(self) -> dict[str, str]: ...

    def shutdown(self) -> None: ...

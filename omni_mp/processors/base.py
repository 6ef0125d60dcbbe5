"""What a stage processor sees and returns (see omni_mp.processors for the contract)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import torch

if TYPE_CHECKING:
    from omni_mp.config import StageConfig


class UpstreamResult(msgspec.Struct):
    """What one upstream stage produced for a request, accumulated chunk by chunk."""

    stage_id: int
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = []
    # Last-layer hidden states of the tokens it computed, in position order (prompt first),
    # as the chunks brought them; hidden_starts[i] is the row index of hidden[i][0].
    hidden: list[torch.Tensor] = []
    hidden_starts: list[int] = []
    hidden_rows: int = 0
    # M-RoPE models: the positions [3, prompt_len] of its prompt and the offset of every later
    # position (text after images runs ahead of or behind the token index).
    mrope_positions: torch.Tensor | None = None
    mrope_delta: int = 0
    finished: bool = False
    finish_reason: str | None = None

    def add_hidden(self, rows: torch.Tensor) -> None:
        self.hidden.append(rows)
        self.hidden_starts.append(self.hidden_rows)
        self.hidden_rows += rows.shape[0]

    def hidden_states(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows [start, end) (end None: all), touching only the chunks that hold them: a
        streaming consumer asks for the few new rows of each step, never for all again."""
        end = self.hidden_rows if end is None else end
        i = max(0, bisect.bisect_right(self.hidden_starts, start) - 1)
        parts = []
        while i < len(self.hidden) and self.hidden_starts[i] < end:
            s0 = self.hidden_starts[i]
            parts.append(self.hidden[i][max(0, start - s0) : end - s0])
            i += 1
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class RequestContext(msgspec.Struct, frozen=True):
    """Per-request options a processor may use (from the client's Submit)."""

    speaker: str | None = None


class StageInput(msgspec.Struct):
    """A stage's prompt and how the engine should treat it.

    `prompt_token_ids` alone: a token prompt. `prompt_embeds` alone: embeddings [n, width] of
    the stage's model. Both: embeddings, with `prompt_token_ids` as the ids the sampler counts
    for repetition penalties (vLLM's mixed prompt; nothing is embedded from them)."""

    prompt_token_ids: list[int] | None = None
    prompt_embeds: torch.Tensor | None = None
    prompt_text: str | None = None  # entry stages: text the engine tokenizes with its media
    multi_modal: dict[str, list[Any]] | None = None  # vLLM multi_modal_data of an entry stage
    positions: tuple[torch.Tensor, int] | None = None  # M-RoPE prompt positions [3, p] and later offset
    step_fill: torch.Tensor | None = None  # the extra row of every step after the stream's last one
    stop_token_ids: list[int] = []  # added to the request's sampling parameters
    suppress_token_ids: list[int] = []  # never sampled


class ProcessorError(ValueError):
    """Upstream results cannot be turned into this stage's input."""


class StageProcessor:
    step_embeds_enabled = False  # True: the stage adds per-step extra embeddings
    prompt_embeds_enabled = False  # True: prompts come as embeddings
    needs_hidden_states = False  # True: upstream stages must emit hidden states
    streams_inputs = False  # True: a started request takes more input ids (`more_inputs`)
    feeds_diffusion = False  # True: made for a diffusion stage (codec ids in); False: for AR stages
    speakers: frozenset[str] | None = None  # voices a request may pick (None: no voice here)

    def bind(self, stage: StageConfig, model_dir: str) -> StageProcessor:
        """The processor a stage process uses: processors that need model data (embedding
        tables, speakers) load it here; stateless ones are shared."""
        return self

    def prompt(self, upstream: Mapping[int, UpstreamResult], ctx: RequestContext) -> StageInput | None:
        raise NotImplementedError

    def step_embeds(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[torch.Tensor | None, bool]:
        """(the extra rows from row `start` on known so far, or None; is the list complete?).
        Only for processors with step_embeds_enabled."""
        raise NotImplementedError

    def more_inputs(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[list[int], bool]:
        """(the input ids from `start` on known so far; are they complete?). Only for
        processors with streams_inputs."""
        raise NotImplementedError


def single_upstream(upstream: Mapping[int, UpstreamResult], name: str) -> UpstreamResult:
    if len(upstream) != 1:
        raise ProcessorError(f"processor {name!r} takes exactly one upstream stage, got {sorted(upstream)}")
    return next(iter(upstream.values()))

"""What a stage processor sees and returns (see omni_mp.models.processor for the contract). A
processor returns the stage's input as a `StageInput`, the engine boundary's type."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import torch

from omni_mp.engines.base import StageInput
from omni_mp.engines.rows import RowStream

if TYPE_CHECKING:
    from omni_mp.config.schema import StageConfig


class UpstreamResult(msgspec.Struct):
    """What one upstream stage produced for a request, accumulated chunk by chunk."""

    stage_id: int
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = []
    # Last-layer hidden states of the tokens it computed, in position order (prompt first).
    hidden: RowStream = msgspec.field(default_factory=RowStream)
    # The intermediate layers it streams (`hidden_states.layers`, HF numbering), same rows.
    layers: dict[int, RowStream] = {}
    # M-RoPE models: the positions [3, prompt_len] of its prompt and the offset of every later
    # position (text after images runs ahead of or behind the token index).
    mrope_positions: torch.Tensor | None = None
    mrope_delta: int = 0
    finished: bool = False
    finish_reason: str | None = None
    # The named values its first chunk carried (StageInput.first_chunk_info of an entry stage).
    first_info: dict[str, Any] = {}

    @property
    def hidden_rows(self) -> int:
        return self.hidden.rows

    def hidden_states(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows [start, end) (end None: all), touching only the chunks that hold them: a
        streaming consumer asks for the few new rows of each step, never for all again."""
        return self.hidden.slice(start, end)

    def layer_states(self, layer: int, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows [start, end) of intermediate `layer` (ProcessorError if upstream does not stream it)."""
        stream = self.layers.get(layer)
        if stream is None:
            raise ProcessorError(
                f"stage {self.stage_id} streams no hidden layer {layer} "
                f"(its `hidden_states.layers`: {sorted(self.layers)})"
            )
        return stream.slice(start, end)


class RequestContext(msgspec.Struct, frozen=True):
    """Per-request options a processor may use (from the client's Submit)."""

    speaker: str | None = None
    params: dict[str, Any] | None = None  # the client's model parameters (Submit.params)


class ProcessorError(ValueError):
    """Upstream results cannot be turned into this stage's input."""


class Silent:
    """What `prompt` returns for a request that has nothing for this stage (e.g. a talker whose
    answer is a tool call: nothing to speak): the stage ends it at once with no output and
    finish_reason SILENT_REASON, and stages downstream see that reason (and may be silent too)."""


SILENT = Silent()
SILENT_REASON = "silent"


class StageProcessor:
    step_embeds_enabled = False  # True: the stage adds per-step extra embeddings
    prompt_embeds_enabled = False  # True: prompts come as embeddings
    needs_hidden_states = False  # True: upstream stages must emit hidden states
    streams_inputs = False  # True: a started request takes more input ids (`more_inputs`)
    feeds_diffusion = False  # True: made for a diffusion stage (codec ids in); False: for AR stages
    prompt_rows = "all"  # or "media": reads upstream prompt rows only at media placeholders (family.Processor)
    speakers: frozenset[str] | None = None  # voices a request may pick (None: no voice here)

    def bind(self, stage: StageConfig, model_dir: str) -> StageProcessor:
        """The processor a stage process uses: processors that need model data (embedding
        tables, speakers) load it here; stateless ones are shared."""
        return self

    def prompt(self, upstream: Mapping[int, UpstreamResult], ctx: RequestContext) -> StageInput | Silent | None:
        """The stage's input once upstream results suffice (None: not yet; SILENT: never)."""
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

"""Stage input processors: turn what upstream stages produced into a stage's inputs.

Processors are looked up by name in `PROCESSORS`; a pipeline YAML names one, it never names
a module path to import (that would let a config file run arbitrary code).

A processor sees the upstream results accumulated so far, chunk by chunk, so a stage can
start before its upstream has finished (a talker speaks while the thinker still writes):
- `prompt()` returns the stage's prompt once it can be built (None: not yet);
- `step_embeds(upstream, start)` (processors with `step_embeds_enabled`) returns the
  per-step extra embeddings known so far from row `start` on, and whether the list is complete;
- `more_inputs(upstream, start)` (processors with `streams_inputs`) returns the input ids
  known so far from `start` on, and whether they are complete (a diffusion stage starts on
  the first codec ids and takes the rest as they come).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

import msgspec
import torch


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


class StageInput(msgspec.Struct):
    """A stage's prompt: token ids, or embeddings [n, hidden] of the stage's model."""

    prompt_token_ids: list[int] | None = None
    prompt_embeds: torch.Tensor | None = None


class ProcessorError(ValueError):
    """Upstream results cannot be turned into this stage's input."""


class StageProcessor:
    step_embeds_enabled = False  # True: the stage adds per-step extra embeddings
    prompt_embeds_enabled = False  # True: prompts come as embeddings
    needs_hidden_states = False  # True: upstream stages must emit hidden states
    streams_inputs = False  # True: a started request takes more input ids (`more_inputs`)
    feeds_diffusion = False  # True: made for a diffusion stage (codec ids in); False: for AR stages

    def prompt(self, upstream: Mapping[int, UpstreamResult]) -> StageInput | None:
        raise NotImplementedError

    def step_embeds(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[torch.Tensor | None, bool]:
        """(the extra rows from row `start` on known so far, or None; is the list complete?).
        Only for processors with step_embeds_enabled."""
        raise NotImplementedError

    def more_inputs(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[list[int], bool]:
        """(the input ids from `start` on known so far; are they complete?). Only for
        processors with streams_inputs."""
        raise NotImplementedError


def _single(upstream: Mapping[int, UpstreamResult], name: str) -> UpstreamResult:
    if len(upstream) != 1:
        raise ProcessorError(f"processor {name!r} takes exactly one upstream stage, got {sorted(upstream)}")
    return next(iter(upstream.values()))


class ContinueTokens(StageProcessor):
    """Continue the upstream sequence: its prompt followed by everything it generated."""

    def prompt(self, upstream: Mapping[int, UpstreamResult]) -> StageInput | None:
        up = _single(upstream, "continue_tokens")
        if not up.finished:
            return None
        return StageInput(prompt_token_ids=(up.prompt_token_ids or []) + up.output_token_ids)


class GeneratedTokens(StageProcessor):
    """Only what the upstream stage generated becomes the prompt."""

    def prompt(self, upstream: Mapping[int, UpstreamResult]) -> StageInput | None:
        up = _single(upstream, "generated_tokens")
        if not up.finished:
            return None
        if not up.output_token_ids:
            raise ProcessorError(f"stage {up.stage_id} generated no tokens to use as a prompt")
        return StageInput(prompt_token_ids=list(up.output_token_ids))


class ThinkerToTalker(StageProcessor):
    """The thinker -> talker link of omni models, in its generic form.

    The talker's prompt is the thinker's last-layer hidden states of the prompt [L, H]
    (available after the thinker's prefill). Decode step k of the talker adds the thinker's
    hidden state of its generated token k (row L+k) to the input embedding, so the talker
    follows the reply as it is written; when the thinker has finished and its rows are used
    up, the extra is zero. Row L+k exists once the thinker has fed token k back, so the
    talker waits whenever it runs ahead of the thinker. Widths must match (H of both models).
    """

    step_embeds_enabled = True
    prompt_embeds_enabled = True
    needs_hidden_states = True

    def prompt(self, upstream: Mapping[int, UpstreamResult]) -> StageInput | None:
        up = _single(upstream, "thinker_to_talker")
        if up.prompt_token_ids is None:
            return None
        n = len(up.prompt_token_ids)
        if up.hidden_rows < n:
            if up.finished:
                raise ProcessorError(
                    f"stage {up.stage_id} finished with {up.hidden_rows} hidden rows for a {n}-token prompt"
                )
            return None
        return StageInput(prompt_embeds=up.hidden_states(0, n))

    def step_embeds(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[torch.Tensor | None, bool]:
        up = _single(upstream, "thinker_to_talker")
        first = len(up.prompt_token_ids or []) + start
        if up.hidden_rows <= first:
            return None, up.finished
        return up.hidden_states(first), up.finished


class CodecTokens(StageProcessor):
    """Codec ids generated by an upstream AR stage (a talker) feed a diffusion stage (token2wav)
    as they are generated: the stage starts on the first ids and takes the rest chunk by
    chunk. A stop token (finish reason "stop": vLLM keeps it as the last output id) ends the
    codes and is not passed on, as transformers cuts codes at the first stop id."""

    streams_inputs = True
    feeds_diffusion = True

    @staticmethod
    def _codes(up: UpstreamResult) -> list[int]:
        ids = up.output_token_ids
        return ids[:-1] if up.finished and up.finish_reason == "stop" and ids else ids

    def prompt(self, upstream: Mapping[int, UpstreamResult]) -> StageInput | None:
        up = _single(upstream, "codec_tokens")
        codes = self._codes(up)
        if not codes:
            if up.finished:
                raise ProcessorError(f"stage {up.stage_id} generated no codec ids")
            return None
        return StageInput(prompt_token_ids=list(codes))

    def more_inputs(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[list[int], bool]:
        up = _single(upstream, "codec_tokens")
        return list(self._codes(up)[start:]), up.finished


PROCESSORS: dict[str, StageProcessor] = {
    "codec_tokens": CodecTokens(),
    "continue_tokens": ContinueTokens(),
    "generated_tokens": GeneratedTokens(),
    "thinker_to_talker": ThinkerToTalker(),
}

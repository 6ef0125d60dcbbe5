"""Stage input processors: turn what upstream stages produced into a stage's prompt.

Processors are looked up by name in `PROCESSORS`; a pipeline YAML names one, it never names
a module path to import (that would let a config file run arbitrary code).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec


class UpstreamResult(msgspec.Struct):
    """What one upstream stage produced for a request, accumulated chunk by chunk."""

    stage_id: int
    prompt_token_ids: list[int] = []
    output_token_ids: list[int] = []
    finished: bool = False
    finish_reason: str | None = None


class StageInput(msgspec.Struct):
    """The prompt a processor builds for its stage."""

    prompt_token_ids: list[int]


class ProcessorError(ValueError):
    """Upstream results cannot be turned into this stage's input."""


Processor = Callable[[Mapping[int, UpstreamResult]], StageInput]


def _single(upstream: Mapping[int, UpstreamResult], name: str) -> UpstreamResult:
    if len(upstream) != 1:
        raise ProcessorError(f"processor {name!r} takes exactly one upstream stage, got {sorted(upstream)}")
    return next(iter(upstream.values()))


def continue_tokens(upstream: Mapping[int, UpstreamResult]) -> StageInput:
    """Continue the upstream sequence: its prompt followed by everything it generated."""
    up = _single(upstream, "continue_tokens")
    return StageInput(prompt_token_ids=up.prompt_token_ids + up.output_token_ids)


def generated_tokens(upstream: Mapping[int, UpstreamResult]) -> StageInput:
    """Only what the upstream stage generated becomes the prompt."""
    up = _single(upstream, "generated_tokens")
    if not up.output_token_ids:
        raise ProcessorError(f"stage {up.stage_id} generated no tokens to use as a prompt")
    return StageInput(prompt_token_ids=list(up.output_token_ids))


PROCESSORS: dict[str, Processor] = {
    "continue_tokens": continue_tokens,
    "generated_tokens": generated_tokens,
}

"""What the stage loop needs from an engine, whatever its kind (AR or diffusion).

Both kinds are vLLM `EngineCore`s in the stage process; the loop adds requests, steps while
`can_step()`, forwards each step's outputs, aborts, and fails the requests the engine could
not serve (`take_failed`). One request lifecycle (abort, deadline, errors, streaming,
restart) for both: the loop does not know which kind it drives, beyond the processor's
choice of how upstream data continues a started request (per-step embeddings or more input ids).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from omni_mp.wire.messages import AdditionalInformation, SamplingParamsMsg


@dataclass(frozen=True, slots=True)
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    info: AdditionalInformation | None = None  # named outputs of the step (diffusion: an audio chunk)


@dataclass(frozen=True, slots=True)
class PromptIds:
    """A started request's prompt as the engine holds it."""

    length: int
    token_ids: list[int] | None  # None: an embeddings prompt (or a diffusion stage's open input)


class EngineInputError(ValueError):
    """The engine rejected a request's input (the message says what and why)."""


class StageEngine(Protocol):
    def tokenize(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str | None: ...

    @property
    def speakers(self) -> frozenset[str] | None:
        """The voices a request may pick (None: this engine does not speak)."""
        ...

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
        step_embeds: Any = None,
        speaker: str | None = None,
    ) -> PromptIds:
        """Start a request. Raises EngineInputError."""
        ...

    def add_inputs(self, request_id: str, ids: Sequence[int], closed: bool) -> None:
        """More input ids of a started request (stages whose processor streams inputs)."""
        ...

    def abort(self, request_ids: list[str]) -> None: ...

    def has_work(self) -> bool: ...

    def can_step(self) -> bool: ...

    def step(self) -> tuple[list[StepOutput], bool]: ...

    def take_failed(self) -> dict[str, str]: ...

    def shutdown(self) -> None: ...

"""The talker -> code2wav link (`processor: qwen3_omni_code2wav`): the 16 codes of every frame the
talker completes, as code2wav's input ids (frame by frame, group 0..15), streamed as they come.

The talker's frames travel on its hidden rows (omni_mp.models.qwen3_omni.codes: frame f on row
P + f, P = the talker's prompt length, codes in the last 16 columns). A finished talker has
sent the rows of all its frames, so its input is then complete. A row at or past P without
codes (NO_CODE) is a frame the talker could not complete: the request fails rather than
speak a wrong frame.
"""

from __future__ import annotations

from collections.abc import Mapping

from omni_mp.engines.base import StageInput
from omni_mp.models.processor import (
    SILENT,
    SILENT_REASON,
    ProcessorError,
    RequestContext,
    Silent,
    StageProcessor,
    UpstreamResult,
    single_upstream,
)
from omni_mp.models.qwen3_omni.codes import NO_CODE, NUM_CODE_GROUPS, codes_of_rows

NAME = "qwen3_omni_code2wav"


class Qwen3OmniCode2WavInputs(StageProcessor):
    needs_hidden_states = True
    streams_inputs = True
    feeds_diffusion = True

    @staticmethod
    def _codes(up: UpstreamResult, start: int) -> list[int]:
        """The codes of the frames the talker has completed, from code `start` on (a frame boundary)."""
        if up.prompt_token_ids is None:
            return []
        first = len(up.prompt_token_ids) + start // NUM_CODE_GROUPS
        if up.hidden_rows <= first:
            return []
        codes = codes_of_rows(up.hidden_states(first))
        if bool((codes == NO_CODE).any()):
            bad = first - len(up.prompt_token_ids) + int((codes == NO_CODE).any(1).nonzero()[0])
            raise ProcessorError(f"stage {up.stage_id}: frame {bad} has no codes (the talker could not complete it)")
        return codes.reshape(-1).tolist()

    def prompt(self, upstream: Mapping[int, UpstreamResult], ctx: RequestContext) -> StageInput | Silent | None:
        up = single_upstream(upstream, NAME)
        if up.finished and up.finish_reason == SILENT_REASON:
            return SILENT  # the talker had nothing to speak (a tool call): no audio either
        codes = self._codes(up, 0)
        if not codes:
            if up.finished:
                raise ProcessorError(f"stage {up.stage_id} completed no audio frame")
            return None
        return StageInput(prompt_token_ids=codes)

    def more_inputs(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[list[int], bool]:
        up = single_upstream(upstream, NAME)
        return self._codes(up, start), up.finished

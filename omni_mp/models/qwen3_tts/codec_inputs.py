"""The talker -> codec decoder link (`processor: qwen3_tts_codec`): Qwen3-Omni's (every completed
frame's 16 codes, streamed; omni_mp.models.qwen3_omni.code2wav_inputs), and for in-context cloning
the clip's codes first, as context the decoder decodes and does not emit (`context_ids`): the
reference decodes the clip's codes before the new ones and cuts the clip's share of the audio.

The clip's codes come on the talker's first chunk (`CLIP_CODES_KEY`, set by the entry stage's
prompt format, omni_mp.models.qwen3_tts.prompt).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from omni_mp.engines.base import StageInput
from omni_mp.models.processor import (
    ProcessorError,
    RequestContext,
    Silent,
    UpstreamResult,
    single_upstream,
)
from omni_mp.models.qwen3_omni.code2wav_inputs import Qwen3OmniCode2WavInputs
from omni_mp.models.qwen3_omni.codes import NUM_CODE_GROUPS
from omni_mp.models.qwen3_tts.prompt import CLIP_CODES_KEY

NAME = "qwen3_tts_codec"


def _clip_codes(up: UpstreamResult) -> torch.Tensor | None:
    """The clip's codes [frames, 16] (None: not in-context cloning)."""
    codes = up.first_info.get(CLIP_CODES_KEY)
    if codes is not None and (
        not isinstance(codes, torch.Tensor) or codes.ndim != 2 or codes.shape[1] != NUM_CODE_GROUPS
    ):
        raise ProcessorError(f"stage {up.stage_id}: {CLIP_CODES_KEY} is not a [frames, {NUM_CODE_GROUPS}] tensor")
    return codes


class Qwen3TtsCodecInputs(Qwen3OmniCode2WavInputs):
    def prompt(self, upstream: Mapping[int, UpstreamResult], ctx: RequestContext) -> StageInput | Silent | None:
        got = super().prompt(upstream, ctx)
        if not isinstance(got, StageInput):
            return got
        clip = _clip_codes(single_upstream(upstream, NAME))
        if clip is None:
            return got
        ids = clip.reshape(-1).tolist()
        return StageInput(prompt_token_ids=ids + list(got.prompt_token_ids or []), context_ids=len(ids))

    def more_inputs(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[list[int], bool]:
        up = single_upstream(upstream, NAME)
        clip = _clip_codes(up)
        return self._codes(up, start - (0 if clip is None else clip.numel())), up.finished

"""The text encoder -> DiT link (`processor: qwen_image_dit`).

The encoder stage runs the prompt (and, with true CFG, the negative prompt as a companion
sequence) prefill-only and emits their last-layer rows after the final norm, the negative
prompt's after the prompt's. The DiT's conditioning is each prompt's rows with the template's
first 34 rows dropped; the prompt's length is the encoder's prompt length (its first chunk).
"""

from __future__ import annotations

from collections.abc import Mapping

from omni_mp.engines.base import StageInput
from omni_mp.models.processor import ProcessorError, RequestContext, StageProcessor, UpstreamResult, single_upstream
from omni_mp.models.qwen_image.prompt import TEMPLATE_DROP


class QwenImageDiTInputs(StageProcessor):
    needs_hidden_states = True
    feeds_diffusion = True

    def prompt(self, upstream: Mapping[int, UpstreamResult], ctx: RequestContext) -> StageInput | None:
        up = single_upstream(upstream, "qwen_image_dit")
        if not up.finished:
            return None  # the encoder emits every row of a request in its one (last) step
        if up.prompt_token_ids is None:
            raise ProcessorError(f"stage {up.stage_id} sent no prompt ids")
        n = len(up.prompt_token_ids)
        rows = up.hidden_states()
        if n <= TEMPLATE_DROP or rows.shape[0] < n:
            raise ProcessorError(f"stage {up.stage_id}: {rows.shape[0]} hidden rows for a {n}-token prompt")
        companions = []
        if rows.shape[0] > n:  # the negative prompt's rows follow
            if rows.shape[0] - n <= TEMPLATE_DROP:
                raise ProcessorError(f"stage {up.stage_id}: {rows.shape[0] - n} rows of a negative prompt")
            companions = [StageInput(prompt_embeds=rows[n + TEMPLATE_DROP :])]
        return StageInput(prompt_embeds=rows[TEMPLATE_DROP:n], companions=companions, params=ctx.params)

"""The talker -> code2wav processor (`qwen3_omni_code2wav`) on talker rows laid out as
omni_mp.models.qwen3_omni.codes specifies: prompt rows without codes, then one row per frame
with its 16 codes in the last columns, arriving in blocks as the talker steps."""

from __future__ import annotations

import pytest
import torch

from omni_mp.models import registry
from omni_mp.models.processor import ProcessorError, RequestContext, UpstreamResult
from omni_mp.models.qwen3_omni.codes import NO_CODE, NUM_CODE_GROUPS, row_width

HIDDEN = 8
PROMPT = 5


def talker_rows(codes: torch.Tensor, with_prompt: bool) -> torch.Tensor:
    """[n, hidden + 16] float32 rows: random hidden states, the frames' codes (or NO_CODE)."""
    n = codes.shape[0] + (PROMPT if with_prompt else 0)
    rows = torch.randn(n, row_width(HIDDEN))
    rows[:, HIDDEN:] = NO_CODE
    rows[n - codes.shape[0] :, HIDDEN:] = codes.float()
    return rows


def test_frames_stream_as_codes_in_talker_order() -> None:
    proc = registry.stage_processor("qwen3_omni_code2wav")
    assert proc.needs_hidden_states and proc.streams_inputs and proc.feeds_diffusion
    codes = torch.randint(0, 2048, (7, NUM_CODE_GROUPS), generator=torch.Generator().manual_seed(0))
    up = UpstreamResult(stage_id=1, prompt_token_ids=list(range(PROMPT)))
    up.hidden.append(talker_rows(codes[:0], with_prompt=True)[:PROMPT])
    assert proc.prompt({1: up}, RequestContext()) is None  # no frame yet: the stage waits
    up.hidden.append(talker_rows(codes[:2], with_prompt=False))
    first = proc.prompt({1: up}, RequestContext())
    assert first is not None and first.prompt_token_ids == codes[:2].reshape(-1).tolist()
    assert proc.more_inputs({1: up}, 2 * NUM_CODE_GROUPS) == ([], False)
    up.hidden.append(talker_rows(codes[2:], with_prompt=False))
    up.finished = True
    more, closed = proc.more_inputs({1: up}, 2 * NUM_CODE_GROUPS)
    assert closed and more == codes[2:].reshape(-1).tolist()


def test_a_frame_without_codes_fails_the_request() -> None:
    proc = registry.stage_processor("qwen3_omni_code2wav")
    codes = torch.randint(0, 2048, (3, NUM_CODE_GROUPS))
    rows = talker_rows(codes, with_prompt=True)
    rows[PROMPT + 1, HIDDEN:] = NO_CODE
    up = UpstreamResult(stage_id=1, prompt_token_ids=list(range(PROMPT)))
    up.hidden.append(rows)
    with pytest.raises(ProcessorError, match="frame 1 has no codes"):
        proc.prompt({1: up}, RequestContext())


def test_a_talker_that_finished_without_frames_fails_the_request() -> None:
    proc = registry.stage_processor("qwen3_omni_code2wav")
    up = UpstreamResult(stage_id=1, prompt_token_ids=list(range(PROMPT)), finished=True)
    up.hidden.append(talker_rows(torch.zeros(0, NUM_CODE_GROUPS), with_prompt=True))
    with pytest.raises(ProcessorError, match="completed no audio frame"):
        proc.prompt({1: up}, RequestContext())

"""Stage input processors on accumulated upstream results (no engine needed)."""

from __future__ import annotations

import pytest
import torch

from omni_mp.processors import PROCESSORS, ProcessorError, UpstreamResult


def test_hidden_rows_by_range_touch_only_their_chunks() -> None:
    up = UpstreamResult(stage_id=0)
    full = torch.arange(40.0).reshape(20, 2)
    for a, b in [(0, 7), (7, 8), (8, 15), (15, 20)]:
        up.add_hidden(full[a:b])
    for start in range(20):
        for end in range(start + 1, 21):
            assert torch.equal(up.hidden_states(start, end), full[start:end])
    assert torch.equal(up.hidden_states(), full)


def test_thinker_to_talker_builds_prompt_then_streams_step_rows() -> None:
    proc = PROCESSORS["thinker_to_talker"]
    up = UpstreamResult(stage_id=0)
    rows = torch.randn(9, 4)
    assert proc.prompt({0: up}) is None  # nothing yet
    up.prompt_token_ids = [1, 2, 3, 4, 5]
    up.add_hidden(rows[:3])
    assert proc.prompt({0: up}) is None  # the prompt's rows are not all there
    up.add_hidden(rows[3:6])
    prompt = proc.prompt({0: up})
    assert prompt is not None and torch.equal(prompt.prompt_embeds, rows[:5])
    got, complete = proc.step_embeds({0: up}, 0)
    assert torch.equal(got, rows[5:6]) and not complete
    up.add_hidden(rows[6:9])
    up.finished = True
    got, complete = proc.step_embeds({0: up}, 1)
    assert torch.equal(got, rows[6:9]) and complete
    assert proc.step_embeds({0: up}, 4) == (None, True)


def test_processors_reject_what_they_cannot_use() -> None:
    up = UpstreamResult(stage_id=3, prompt_token_ids=[1, 2], finished=True)
    with pytest.raises(ProcessorError, match="generated no tokens"):
        PROCESSORS["generated_tokens"].prompt({3: up})
    with pytest.raises(ProcessorError, match="0 hidden rows for a 2-token prompt"):
        PROCESSORS["thinker_to_talker"].prompt({3: up})
    with pytest.raises(ProcessorError, match="exactly one upstream"):
        PROCESSORS["continue_tokens"].prompt({3: up, 4: up})


def test_codec_tokens_start_on_the_first_ids_and_drop_the_stop_token() -> None:
    proc = PROCESSORS["codec_tokens"]
    up = UpstreamResult(stage_id=0, prompt_token_ids=[9, 9])
    assert proc.prompt({0: up}) is None  # no codes yet
    up.output_token_ids = [5, 6]
    assert proc.prompt({0: up}).prompt_token_ids == [5, 6]  # the prompt ids are not codes
    assert proc.more_inputs({0: up}, 2) == ([], False)
    up.output_token_ids += [7, 8, 124]
    assert proc.more_inputs({0: up}, 2) == ([7, 8, 124], False)  # not finished: every id is a code
    up.finished, up.finish_reason = True, "stop"
    assert proc.more_inputs({0: up}, 2) == ([7, 8], True)  # the stop token is not a code
    up.finish_reason = "length"
    assert proc.more_inputs({0: up}, 4) == ([124], True)  # "length": the last id is a code
    empty = UpstreamResult(stage_id=0, output_token_ids=[3], finished=True, finish_reason="stop")
    with pytest.raises(ProcessorError, match="generated no codec ids"):
        proc.prompt({0: empty})

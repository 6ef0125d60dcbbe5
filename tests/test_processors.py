"""Stage input processors on accumulated upstream results (no engine needed)."""

from __future__ import annotations

import pytest
import torch

from omni_mp.models.processor import ProcessorError, RequestContext, UpstreamResult
from omni_mp.models.registry import stage_processor

CTX = RequestContext()


def test_hidden_rows_by_range_touch_only_their_chunks() -> None:
    up = UpstreamResult(stage_id=0)
    full = torch.arange(40.0).reshape(20, 2)
    for a, b in [(0, 7), (7, 8), (8, 15), (15, 20)]:
        up.hidden.append(full[a:b])
    for start in range(20):
        for end in range(start + 1, 21):
            assert torch.equal(up.hidden_states(start, end), full[start:end])
    assert torch.equal(up.hidden_states(), full)


def test_a_stream_may_begin_past_position_0_and_then_takes_no_gap() -> None:
    """An upstream that read its prefix cache sends rows from the first one its reader reads:
    the stream begins there; rows below it, a later gap or an overlap are refused."""
    from omni_mp.engines.rows import RowGap, RowStream

    full = torch.arange(40.0).reshape(20, 2)
    stream = RowStream()
    stream.append(full[6:9], 6)
    stream.append(full[9:12], 9)
    assert (stream.first, stream.rows) == (6, 12)
    assert torch.equal(stream.slice(7, 11), full[7:11]) and torch.equal(stream.row(6), full[6])
    for bad in (lambda: stream.slice(5, 8), lambda: stream.row(0)):
        with pytest.raises(RowGap, match="begins at position 6"):
            bad()
    for start in (13, 11):
        with pytest.raises(RowGap, match=f"rows from position {start} after 12 rows"):
            stream.append(full[start : start + 1], start)


def test_thinker_to_talker_builds_prompt_then_streams_step_rows() -> None:
    proc = stage_processor("thinker_to_talker")
    up = UpstreamResult(stage_id=0)
    rows = torch.randn(9, 4)
    assert proc.prompt({0: up}, CTX) is None  # nothing yet
    up.prompt_token_ids = [1, 2, 3, 4, 5]
    up.hidden.append(rows[:3])
    assert proc.prompt({0: up}, CTX) is None  # the prompt's rows are not all there
    up.hidden.append(rows[3:6])
    prompt = proc.prompt({0: up}, CTX)
    assert prompt is not None and torch.equal(prompt.prompt_embeds, rows[:5])
    got, complete = proc.step_embeds({0: up}, 0)
    assert torch.equal(got, rows[5:6]) and not complete
    up.hidden.append(rows[6:9])
    up.finished = True
    got, complete = proc.step_embeds({0: up}, 1)
    assert torch.equal(got, rows[6:9]) and complete
    assert proc.step_embeds({0: up}, 4) == (None, True)


def test_processors_reject_what_they_cannot_use() -> None:
    up = UpstreamResult(stage_id=3, prompt_token_ids=[1, 2], finished=True)
    with pytest.raises(ProcessorError, match="generated no tokens"):
        stage_processor("generated_tokens").prompt({3: up}, CTX)
    with pytest.raises(ProcessorError, match="0 hidden rows for a 2-token prompt"):
        stage_processor("thinker_to_talker").prompt({3: up}, CTX)
    with pytest.raises(ProcessorError, match="exactly one upstream"):
        stage_processor("continue_tokens").prompt({3: up, 4: up}, CTX)


def test_codec_tokens_start_on_the_first_ids_and_drop_the_stop_token() -> None:
    proc = stage_processor("codec_tokens")
    up = UpstreamResult(stage_id=0, prompt_token_ids=[9, 9])
    assert proc.prompt({0: up}, CTX) is None  # no codes yet
    up.output_token_ids = [5, 6]
    assert proc.prompt({0: up}, CTX).prompt_token_ids == [5, 6]  # the prompt ids are not codes
    assert proc.more_inputs({0: up}, 2) == ([], False)
    up.output_token_ids += [7, 8, 124]
    assert proc.more_inputs({0: up}, 2) == ([7, 8, 124], False)  # not finished: every id is a code
    up.finished, up.finish_reason = True, "stop"
    assert proc.more_inputs({0: up}, 2) == ([7, 8], True)  # the stop token is not a code
    up.finish_reason = "length"
    assert proc.more_inputs({0: up}, 4) == ([124], True)  # "length": the last id is a code
    empty = UpstreamResult(stage_id=0, output_token_ids=[3], finished=True, finish_reason="stop")
    with pytest.raises(ProcessorError, match="generated no codec ids"):
        proc.prompt({0: empty}, CTX)


def _omni_upstream(prompt: list[int], reply: list[int], hidden: torch.Tensor, finished: bool) -> UpstreamResult:
    up = UpstreamResult(stage_id=0, prompt_token_ids=prompt, output_token_ids=list(reply), finished=finished)
    up.hidden.append(hidden)
    return up


def test_qwen2_5_omni_talker_inputs_stream_like_the_whole_reply() -> None:
    """Fed chunk by chunk as the thinker writes, the talker's prompt and per-step rows are the
    same as when the whole reply is there; after the reply come the text-end and text-pad rows."""
    from omni_mp.config.schema import StageConfig
    from omni_mp.models.checkpoint import load_tensors
    from omni_mp.models.registry import resolve_model

    model_dir = resolve_model("tiny-token2wav")  # a full tiny Qwen2.5-Omni checkpoint
    stage = StageConfig(id=1, model="tiny-token2wav", inputs=[0], processor="qwen2_5_omni_talker")
    proc = stage_processor("qwen2_5_omni_talker").bind(stage, model_dir)
    embed = load_tensors(model_dir, ["thinker.model.embed_tokens.weight"])["thinker.model.embed_tokens.weight"]
    gen = torch.Generator().manual_seed(0)
    # 300: the audio placeholder id, zero in the prompt; a reply token with that id keeps its embedding.
    prompt, reply = [5, 300, 300, 7], [11, 300, 13, 14, 15, 16]
    L, N = len(prompt), len(reply)
    hidden = torch.randn(L + N - 1, embed.shape[1], generator=gen)  # the last reply token is never fed back

    whole = _omni_upstream(prompt, reply, hidden, finished=True)
    first = proc.prompt({0: whole}, RequestContext(speaker="Ethan"))
    assert first is not None and first.prompt_embeds is not None
    assert first.prompt_token_ids == [126] * L + [122, 123] and first.stop_token_ids == [122, 124]
    assert first.suppress_token_ids == [123]
    # Placeholder rows carry the hidden state alone; text rows add the token embedding.
    torch.testing.assert_close(first.prompt_embeds[1], hidden[1])
    torch.testing.assert_close(first.prompt_embeds[0], hidden[0] + embed[5])
    rows, complete = proc.step_embeds({0: whole}, 0)
    assert complete and rows is not None and rows.shape[0] == N  # r_1..r_{N-2}, text end, text pad
    torch.testing.assert_close(rows[0], embed[300] + hidden[L + 1])
    torch.testing.assert_close(rows[-1], first.step_fill)

    streamed: list[torch.Tensor] = []
    got = None
    for n in range(1, N + 1):  # the thinker has written n tokens and fed back n - 1
        up = _omni_upstream(prompt, reply[:n], hidden[: L + n - 1], finished=n == N)
        if got is None:
            got = proc.prompt({0: up}, RequestContext(speaker="Ethan"))
            if got is None:
                assert n == 1  # y_0 must be fed back first
                continue
            torch.testing.assert_close(got.prompt_embeds, first.prompt_embeds)
        part, done = proc.step_embeds({0: up}, sum(r.shape[0] for r in streamed))
        if part is not None:
            streamed.append(part)
        assert done == (n == N)
    torch.testing.assert_close(torch.cat(streamed), rows)
    assert proc.step_embeds({0: whole}, N + 3) == (None, True)  # past the stream: the fill row


def test_qwen2_5_omni_talker_inputs_refuse_what_the_reference_cannot_do() -> None:
    from omni_mp.config.schema import StageConfig
    from omni_mp.models.registry import resolve_model

    model_dir = resolve_model("tiny-token2wav")
    stage = StageConfig(id=1, model="tiny-token2wav", inputs=[0], processor="qwen2_5_omni_talker")
    proc = stage_processor("qwen2_5_omni_talker").bind(stage, model_dir)
    assert proc.speakers == {"Chelsie", "Ethan"}
    one_token = _omni_upstream([5, 6], [9], torch.zeros(2, 64), finished=True)
    with pytest.raises(ProcessorError, match="at least 2 tokens"):
        proc.prompt({0: one_token}, CTX)
    two = _omni_upstream([5, 6], [9, 10], torch.zeros(3, 64), finished=True)
    with pytest.raises(ProcessorError, match="unknown speaker 'Nobody'"):
        proc.prompt({0: two}, RequestContext(speaker="Nobody"))

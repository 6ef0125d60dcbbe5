"""Per-step hidden states out, prompt embeddings and per-step embeddings in: real stage
processes on vLLM, checked against transformers on the same tiny checkpoints (fp32, greedy)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch

from omni_mp.client.omni_client import AsyncOmniClient, InvalidRequest, OmniClient, RequestError
from omni_mp.models.registry import resolve_model
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.hf_oracle import assert_same_tokens, embed_rows, greedy, greedy_hidden, talker_greedy, tokenize
from tests.launcher import REPO, ServedPipeline, serve

pytestmark = pytest.mark.engine

ATOL = 1e-4


def collect(events: list[StageOutputChunk | Finished], stage_id: int = 0) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Tokens and concatenated hidden-state rows of one stage's chunks, checking row order."""
    tokens: list[int] = []
    rows: dict[str, list[torch.Tensor]] = {}
    next_row = 0
    for ev in events:
        if not isinstance(ev, StageOutputChunk) or ev.stage_id != stage_id:
            continue
        tokens += ev.token_ids
        h = ev.hidden
        if h is not None:
            assert h.start == next_row, "hidden-state rows out of order"
            next_row += h.last.shape[0]
            rows.setdefault("hidden_states", []).append(h.last.clone())
            for lr in h.layers:
                rows.setdefault(f"hidden_states.layer{lr.layer}", []).append(lr.rows.clone())
    return tokens, {k: torch.cat(v) for k, v in rows.items()}


@pytest.fixture(scope="module")
def hidden_pipeline() -> Iterator[ServedPipeline]:
    with serve(REPO / "tests" / "configs" / "tiny_hidden.yaml") as served:
        yield served


def test_hidden_states_match_transformers(hidden_pipeline: ServedPipeline) -> None:
    model = resolve_model("tiny-qwen2")
    with OmniClient(hidden_pipeline.endpoint) as client:
        for prompt, n in [("Hello world, how are you?", 12), ("The quick brown fox", 20)]:
            ids = tokenize(model, prompt)
            events = list(
                client.stream(
                    prompt,
                    sampling={0: SamplingParamsMsg(max_tokens=n, ignore_eos=True)},
                    hidden_states=True,
                    timeout_s=120,
                )
            )
            tokens, hidden = collect(events)
            want_tokens, want_layers = greedy_hidden(model, ids, n)
            assert tokens == want_tokens
            # Prompt + every generated token but the last (which is never fed back).
            assert hidden["hidden_states"].shape == (len(ids) + n - 1, 128)
            torch.testing.assert_close(hidden["hidden_states"], want_layers[-1], atol=ATOL, rtol=0)
            torch.testing.assert_close(hidden["hidden_states.layer1"], want_layers[1], atol=ATOL, rtol=0)
            # Streamed step by step: the prompt's rows first, then one row per decode step.
            with_rows = [e for e in events if isinstance(e, StageOutputChunk) and e.hidden is not None]
            assert len(with_rows) == n and with_rows[0].hidden.last.shape[0] == len(ids)


def test_concurrent_requests_each_get_their_own_hidden_states(hidden_pipeline: ServedPipeline) -> None:
    model = resolve_model("tiny-qwen2")
    prompts = [("user: story " + "la " * i).strip() for i in range(10)]
    lengths = [3 + 2 * i for i in range(10)]

    async def run() -> list[list[StageOutputChunk | Finished]]:
        async with AsyncOmniClient(hidden_pipeline.endpoint) as ac:

            async def one(p: str, n: int) -> list[StageOutputChunk | Finished]:
                sampling = {0: SamplingParamsMsg(max_tokens=n, ignore_eos=True)}
                return [e async for e in ac.stream(p, sampling=sampling, hidden_states=True, timeout_s=180)]

            return await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths, strict=True)))

    for prompt, n, events in zip(prompts, lengths, asyncio.run(run()), strict=True):
        ids = tokenize(model, prompt)
        tokens, hidden = collect(events)
        want_tokens, want_layers = greedy_hidden(model, ids, n)
        assert tokens == want_tokens, prompt
        torch.testing.assert_close(hidden["hidden_states"], want_layers[-1], atol=ATOL, rtol=0)


def test_hidden_rows_reach_a_client_only_when_its_request_asks(hidden_pipeline: ServedPipeline) -> None:
    """Two streams at once on one stage, one asking for hidden rows: it gets all of them, the
    other the same tokens and no rows. A request that cannot get them is refused, naming why."""
    model = resolve_model("tiny-qwen2")
    prompt, n = "Hello world, how are you?", 10
    sampling = {0: SamplingParamsMsg(max_tokens=n, ignore_eos=True)}

    async def run() -> tuple[list[StageOutputChunk | Finished], list[StageOutputChunk | Finished]]:
        async with AsyncOmniClient(hidden_pipeline.endpoint) as ac:

            async def one(rows: bool) -> list[StageOutputChunk | Finished]:
                return [e async for e in ac.stream(prompt, sampling=sampling, hidden_states=rows, timeout_s=180)]

            asked, plain = await asyncio.gather(one(True), one(False))
            return asked, plain

    asked, plain = asyncio.run(run())
    want_tokens, want_layers = greedy_hidden(model, tokenize(model, prompt), n)
    tokens, hidden = collect(asked)
    assert tokens == want_tokens
    torch.testing.assert_close(hidden["hidden_states"], want_layers[-1], atol=ATOL, rtol=0)
    tokens, hidden = collect(plain)
    assert tokens == want_tokens and hidden == {}
    assert all(e.hidden is None for e in plain if isinstance(e, StageOutputChunk))
    with OmniClient(hidden_pipeline.endpoint) as client:
        with pytest.raises(InvalidRequest, match="hidden rows arrive in streamed chunks"):
            client.generate(prompt, hidden_states=True, timeout_s=60)


def test_prompt_embeds_equal_to_token_embeddings_give_the_same_tokens(hidden_pipeline: ServedPipeline) -> None:
    model = resolve_model("tiny-qwen2")
    with OmniClient(hidden_pipeline.endpoint) as client:
        for prompt in ["Hello world, how are you?", "0 1 2 3"]:
            ids = tokenize(model, prompt)
            by_ids = client.generate(prompt_token_ids=ids, timeout_s=120).outputs[0].token_ids
            by_embeds = client.generate(prompt_embeds=embed_rows(model, ids), timeout_s=120).outputs[0].token_ids
            want, margins = greedy(model, ids, 12)
            assert_same_tokens(by_ids, want, margins, "ids")
            assert_same_tokens(by_embeds, want, margins, "embeds")


def test_bad_prompt_embeds_are_rejected_with_the_reason(hidden_pipeline: ServedPipeline) -> None:
    from omni_mp.client.omni_client import RequestError

    with OmniClient(hidden_pipeline.endpoint) as client:
        with pytest.raises(RequestError) as err:
            client.generate(prompt_embeds=torch.zeros(4, 64), timeout_s=60)
        assert err.value.code == "invalid_input" and "[n, 128]" in str(err.value)
        with pytest.raises(RequestError) as err:
            client.generate(prompt_embeds=torch.zeros(4, 128, dtype=torch.int32), timeout_s=60)
        assert "floating-point" in str(err.value)
        assert len(client.generate("Hello", timeout_s=60).outputs[0].token_ids) == 12


def thinker_talker_oracle(prompt: str, n0: int, n1: int) -> tuple[list[int], list[int], list[float]]:
    thinker, talker = resolve_model("tiny-qwen2"), resolve_model("tiny-qwen2-b")
    ids = tokenize(thinker, prompt)
    tokens0, layers = greedy_hidden(thinker, ids, n0)
    last = layers[-1]
    tokens1, margins = talker_greedy(talker, last[: len(ids)], last[len(ids) :], n1)
    return tokens0, tokens1, margins


@pytest.fixture(scope="module")
def thinker_talker() -> Iterator[ServedPipeline]:
    with serve(CONFIG_DIR / "tiny_thinker_talker.yaml") as served:
        yield served


def test_thinker_talker_matches_transformers(thinker_talker: ServedPipeline) -> None:
    with OmniClient(thinker_talker.endpoint) as client:
        for prompt in ["Hello world, how are you?", "The quick brown fox"]:
            done = client.generate(prompt, timeout_s=120)
            out = {o.stage_id: o.token_ids for o in done.outputs}
            want0, want1, margins = thinker_talker_oracle(prompt, 16, 24)
            assert out[0] == want0
            # The talker outlives the thinker's reply (24 > 15 rows): the tail uses the zero fill.
            assert_same_tokens(out[1], want1, margins, f"talker({prompt!r})")


def test_hidden_rows_go_downstream_whether_or_not_a_client_asks(thinker_talker: ServedPipeline) -> None:
    """The talker gets the thinker's rows for a request that did not ask for them (its tokens
    match the oracle); the client's stream carries none. Asking for rows of a final stage
    that emits none is refused before any stage works on the request."""
    with OmniClient(thinker_talker.endpoint) as client:
        events = list(client.stream("The quick brown fox", timeout_s=120))
        with pytest.raises(RequestError, match=r"none of the final stages \[1\] emits hidden states"):
            list(client.stream("The quick brown fox", final_stages=[1], hidden_states=True, timeout_s=60))
    assert all(e.hidden is None for e in events if isinstance(e, StageOutputChunk))
    done = events[-1]
    assert isinstance(done, Finished)
    out = {o.stage_id: o.token_ids for o in done.outputs}
    want0, want1, margins = thinker_talker_oracle("The quick brown fox", 16, 24)
    assert out[0] == want0
    assert_same_tokens(out[1], want1, margins, "talker, rows not asked for")


def test_talker_streams_while_the_thinker_writes(thinker_talker: ServedPipeline) -> None:
    """With a long reply the talker starts after the thinker's prefill, not after its end, and
    waits for each step's row: its tokens still match the oracle exactly."""
    n0, n1 = 200, 150
    sampling = {
        0: SamplingParamsMsg(max_tokens=n0, ignore_eos=True),
        1: SamplingParamsMsg(max_tokens=n1, ignore_eos=True),
    }
    with OmniClient(thinker_talker.endpoint) as client:
        done = client.generate("Tell me a story", sampling=sampling, timeout_s=300)
    timings = {d.stage_id: d for d in done.stage_timings}
    assert timings[1].t_started < timings[0].t_finished
    assert timings[1].t_first_token is not None and timings[1].t_first_token < timings[0].t_finished
    out = {o.stage_id: o.token_ids for o in done.outputs}
    want0, want1, margins = thinker_talker_oracle("Tell me a story", n0, n1)
    assert out[0] == want0
    assert_same_tokens(out[1], want1, margins, "streamed talker")

"""The step-embedding gate on a real in-process vLLM engine: a decode step whose extra
embedding has not arrived is not scheduled (the request waits, keeping its KV cache), and
resumes, exactly as transformers computes it, once the rows arrive."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from omni_mp.engines.base import EngineInputError, Extension
from omni_mp.models.registry import resolve_model
from omni_mp.wire.messages import SamplingParamsMsg
from tests.hf_oracle import assert_same_tokens, embed_rows, greedy, talker_greedy, tokenize
from tests.launcher import engine_is_empty, in_process_engine, start_request

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    from omni_mp.engines.ar import EngineFeatures

    args = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 4}
    with in_process_engine("tiny-qwen2-b", args, EngineFeatures(prompt_embeds=True, step_embeds=True)) as eng:
        yield eng


def run_until_quiet(engine: object, tokens: dict[str, list[int]], max_steps: int = 50) -> int:
    """Step while steps compute something; returns how many steps computed tokens."""
    computed = 0
    for _ in range(max_steps):
        if not engine.can_step():  # type: ignore[attr-defined]
            break
        outs, executed = engine.step()  # type: ignore[attr-defined]
        for out in outs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if not executed:
            break
        computed += 1
    return computed


def test_decode_waits_for_its_step_embedding_and_resumes_exactly(engine: object) -> None:
    talker = resolve_model("tiny-qwen2-b")
    ids = tokenize(talker, "Hello world, how are you?")
    prompt = embed_rows(talker, ids)
    g = torch.Generator().manual_seed(0)
    extras = torch.randn(10, 128, generator=g) * 0.5
    n = 14  # longer than the extras: the last steps use the zero fill
    tokens: dict[str, list[int]] = {}
    start_request(
        engine, "talk", SamplingParamsMsg(max_tokens=n, ignore_eos=True), prompt_embeds=prompt, step_embeds=True
    )
    # Prefill runs (and samples code 0); decode step 0 needs extra row 0: nothing more happens.
    assert run_until_quiet(engine, tokens) == 1
    assert len(tokens["talk"]) == 1
    assert not engine.can_step()  # type: ignore[attr-defined]
    # Three rows: exactly three more decode steps, then it waits again.
    engine.extend("talk", Extension(step_rows=extras[:3]))  # type: ignore[attr-defined]
    assert run_until_quiet(engine, tokens) == 3
    assert len(tokens["talk"]) == 4
    # A request without step embeddings is not held back by the waiting one.
    start_request(engine, "plain", SamplingParamsMsg(max_tokens=5, ignore_eos=True), prompt_token_ids=ids)
    run_until_quiet(engine, tokens)
    assert len(tokens["plain"]) == 5 and len(tokens["talk"]) == 4
    # The rest, and the end of the stream: it runs to completion.
    engine.extend("talk", Extension(step_rows=extras[3:], closed=True))  # type: ignore[attr-defined]
    run_until_quiet(engine, tokens)
    want, margins = talker_greedy(talker, prompt, extras, n)
    assert_same_tokens(tokens["talk"], want, margins, "gated talker")
    assert engine_is_empty(engine)


def test_rows_given_with_the_request_feed_its_first_steps_then_the_fill(engine: object) -> None:
    """An entry stage's per-step rows (StageInput.step_rows, e.g. Qwen3-TTS's text fed a token per
    frame): decode step k adds row k, then every later step the fill row; nothing waits."""
    talker = resolve_model("tiny-qwen2-b")
    prompt = embed_rows(talker, tokenize(talker, "Hello world, how are you?"))
    g = torch.Generator().manual_seed(1)
    given, fill = torch.randn(6, 128, generator=g) * 0.5, torch.randn(128, generator=g) * 0.5
    n = 12  # past the given rows: the last steps take the fill
    tokens: dict[str, list[int]] = {}
    sampling = SamplingParamsMsg(max_tokens=n, ignore_eos=True)
    start_request(engine, "given", sampling, prompt_embeds=prompt, step_rows=given, step_fill=fill)
    run_until_quiet(engine, tokens)
    assert engine_is_empty(engine)
    want, margins = talker_greedy(talker, prompt, torch.cat([given, fill.expand(n - given.shape[0], -1)]), n)
    assert_same_tokens(tokens["given"], want, margins, "given step rows")
    # the rows change the codes (the comparison can fail): the fill alone gives others
    alone, _ = talker_greedy(talker, prompt, fill.expand(n, -1), n)
    assert alone != want
    with pytest.raises(EngineInputError, match=r"step_rows: expected \[n, 128\]"):
        start_request(engine, "bad", sampling, prompt_embeds=prompt, step_rows=torch.zeros(2, 64))


def test_wrong_width_step_embeddings_are_rejected(engine: object) -> None:
    from omni_mp.engines.ar import EngineInputError

    ids = tokenize(resolve_model("tiny-qwen2-b"), "Hi")
    start_request(engine, "w", SamplingParamsMsg(max_tokens=3), prompt_token_ids=ids, step_embeds=True)
    with pytest.raises(EngineInputError, match=r"expected \[n, 128\]"):
        engine.extend("w", Extension(step_rows=torch.zeros(2, 64)))  # type: ignore[attr-defined]
    engine.abort(["w"])  # type: ignore[attr-defined]
    engine.step()  # type: ignore[attr-defined]  # the scheduler drops finished requests on its next pass
    assert engine_is_empty(engine)
    assert "w" not in engine.io.requests  # type: ignore[attr-defined]


def test_held_requests_keep_their_slots_under_max_num_seqs(engine: object) -> None:
    """Requests held back by the gate stay running: vLLM's max_num_seqs (4 here) counts them,
    so a fifth request waits for a free slot instead of overflowing the model runner."""
    talker = resolve_model("tiny-qwen2-b")
    ids = tokenize(talker, "Hi there")
    prompt = embed_rows(talker, ids)
    tokens: dict[str, list[int]] = {}
    held = [f"held{i}" for i in range(4)]
    for rid in held:
        start_request(
            engine, rid, SamplingParamsMsg(max_tokens=3, ignore_eos=True), prompt_embeds=prompt, step_embeds=True
        )
    run_until_quiet(engine, tokens)  # four prefills, then all four wait for their rows
    start_request(engine, "plain", SamplingParamsMsg(max_tokens=5, ignore_eos=True), prompt_token_ids=ids)
    run_until_quiet(engine, tokens)
    assert "plain" not in tokens
    assert len(engine.driver.core.scheduler.running) == 4  # type: ignore[attr-defined]
    for rid in held:
        engine.extend(rid, Extension(closed=True))  # type: ignore[attr-defined]
    run_until_quiet(engine, tokens)
    assert [len(tokens[r]) for r in held] == [3, 3, 3, 3]
    want, margins = greedy(talker, ids, 5)
    assert_same_tokens(tokens["plain"], want, margins, "plain request after the held ones")
    assert engine_is_empty(engine)


def test_a_layer_the_model_cannot_output_is_refused_at_load() -> None:
    """Intermediate layers come out of the (compiled, graph-captured) model itself; an index
    outside it is refused when the engine loads, naming the valid range."""
    from omni_mp.engines.ar import EngineFeatures

    args = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 2}
    with pytest.raises(Exception, match=r"hidden_states\.layers: \[7\] not intermediate layers \(0\.\.1"):
        with in_process_engine("tiny-qwen2", args, EngineFeatures(hidden_states=True, hidden_layers=(7,))):
            pass

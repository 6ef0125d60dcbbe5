"""The Qwen3-Omni talker stage's half of the pipeline against transformers'
`Qwen3OmniMoeForConditionalGeneration.generate` on the tiny checkpoint (fp32; greedy thinker,
talker and code predictor; no repetition penalty):

- the processor (`qwen3_omni_talker`) builds, from the thinker's outputs as the thinker stage
  streams them, the talker prompt rows, per-step rows and M-RoPE positions generate builds
  (text, image and audio prompts; measured max |diff| 2e-6, tolerance 1e-5);
- our vLLM talker (real in-process vLLM CPU engine, the code predictor inside its step) gives
  every frame's 16 codes equal to generate's, for requests run alone and for several run
  concurrently while their thinker replies stream in token by token (the talker starts after
  the thinker's first token).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from omni_mp.models.processor import RequestContext
from omni_mp.models.qwen3_omni.codes import codes_of_rows
from omni_mp.models.qwen3_omni.exports import ThinkerTurns
from omni_mp.models.qwen3_omni.prompt import omni_prompt_text
from tests.launcher import engine_is_empty, in_process_engine
from tests.qwen3_talker_oracle import (
    CASES,
    TEXTS,
    OmniRun,
    Talk,
    model_dir,
    omni_model,
    omni_processor,
    oracle,
    processor,
    upstream,
)

ROW_ATOL = 1e-5  # processor rows vs generate's (fp32; measured 2e-6)


@torch.no_grad()
def hf_talker_positions(run: OmniRun, case: str) -> torch.Tensor:
    """transformers' talker positions over its prompt (user ids + 9 assistant ids)."""
    model = omni_model(model_dir())
    proc = processor()
    turns = ThinkerTurns.of(run.prompt_ids, proc.turn_ids)
    cfg = model.config
    ids = torch.tensor([[run.prompt_ids[p] for p in turns.user] + [cfg.tts_pad_token_id] * 9])
    kw = CASES[case]
    prompt = omni_prompt_text(TEXTS[0], n_audio=int("audio" in kw), n_image=int("image" in kw))
    inputs = omni_processor(model_dir())(
        text=prompt,
        audio=[kw["audio"]] if "audio" in kw else None,
        images=[kw["image"]] if "image" in kw else None,
        return_tensors="pt",
    )
    extra = {}
    if "image_grid_thw" in inputs:
        extra["image_grid_thw"] = inputs["image_grid_thw"]
    if "feature_attention_mask" in inputs:
        extra["audio_seqlens"] = inputs["feature_attention_mask"].sum(-1)
    pos, _ = model.talker.get_rope_index(ids, attention_mask=torch.ones_like(ids), **extra)
    return pos[:, 0]


@pytest.mark.parametrize("case", list(CASES))
def test_processor_builds_generates_talker_inputs(case: str) -> None:
    run = oracle(case)
    proc = processor()
    assert proc.prompt({0: upstream(run, 0)}, RequestContext()) is None  # waits for y_0
    got = proc.prompt({0: upstream(run)}, RequestContext(speaker="Ethan"))
    assert got is not None and got.prompt_embeds is not None
    torch.testing.assert_close(got.prompt_embeds, run.talker_prompt, rtol=0, atol=ROW_ATOL)
    rows, closed = proc.step_embeds({0: upstream(run)}, 0)
    assert closed and rows is not None
    torch.testing.assert_close(rows, run.talker_steps, rtol=0, atol=ROW_ATOL)
    torch.testing.assert_close(got.step_fill, run.talker_fill, rtol=0, atol=ROW_ATOL)
    want_pos = hf_talker_positions(run, case)
    n = got.prompt_embeds.shape[0]
    if got.positions is None:  # text only: vLLM's arange
        assert torch.equal(want_pos, torch.arange(n).expand(3, n))
    else:
        assert torch.equal(got.positions[0], want_pos)
    # Streaming: row k waits until the reply token after s_{4+k} exists (the last is never fed).
    for n_reply in range(1, len(run.reply_ids)):
        rows, closed = proc.step_embeds({0: upstream(run, n_reply)}, 0)
        assert not closed and (0 if rows is None else rows.shape[0]) == max(0, n_reply - 2)
        if rows is not None:
            torch.testing.assert_close(rows, run.talker_steps[: rows.shape[0]], rtol=0, atol=ROW_ATOL)
    with pytest.raises(ValueError, match="unknown speaker"):
        proc.prompt({0: upstream(run)}, RequestContext(speaker="nobody"))


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from omni_mp.engines.ar import EngineFeatures
    from omni_mp.models.qwen3_omni.vllm_hooks_talker import talker_engine_model

    em = talker_engine_model(model_dir(), {"dtype": "float32", "enforce_eager": True, "max_model_len": 512})
    args = {**em.engine_args, "max_num_seqs": 4}
    t0 = time.monotonic()
    features = EngineFeatures(hidden_states=True, prompt_embeds=True, step_embeds=True)
    with in_process_engine(em.model, args, features) as eng:
        print(f"\n[q3 talker] engine init {time.monotonic() - t0:.1f}s")
        yield eng


def talk(engine: Any, talks: list[Talk], max_steps: int = 400, *, check: bool = True) -> None:
    by_id = {t.rid: t for t in talks}
    for _ in range(max_steps):
        for t in talks:
            t.feed()
        if all(t.finished for t in talks):
            break
        if not engine.can_step():
            continue
        outputs, _ = engine.step()
        assert not engine.take_failed()
        for out in outputs:
            by_id[out.request_id].take(out)
    else:
        raise AssertionError("talker requests did not finish")
    engine.step()  # the scheduler drops finished requests on its next pass
    assert engine_is_empty(engine)
    for t in talks:
        if check:
            t.check()


def test_codes_equal_transformers_alone(engine: Any) -> None:
    run = oracle("text")
    print(f"\n[q3 talker] {run.codes.shape[0]} frames, {len(run.reply_ids)} thinker tokens")
    talk(engine, [Talk(engine, "alone", run, "Ethan", streamed=False)])


def test_codes_equal_transformers_concurrent_streamed(engine: Any) -> None:
    """Four requests at once (text, image and audio prompts, three speakers), each fed its
    thinker reply one token per engine step: every frame's 16 codes equal generate's."""
    runs = [
        ("img", oracle("image"), "Chelsie"),
        ("aud", oracle("audio", TEXTS[1], "Aiden"), "Aiden"),
        ("txt", oracle("text", TEXTS[2], "Chelsie"), "Chelsie"),
        ("txt2", oracle("text", TEXTS[1]), "Ethan"),
    ]
    talks = [Talk(engine, rid, run, spk, streamed=True) for rid, run, spk in runs]
    talk(engine, talks)
    print(f"[q3 talker] frames {[t.run.codes.shape[0] for t in talks]}")


def test_code_predictor_sampling_matches_generates_warpers() -> None:
    """The sampled code predictor's draw (top-k 50, top-p 0.8, temperature 1) against the
    distribution transformers' own warpers give for the same logits: 20,000 draws per row,
    every code's frequency within 0.015 of its probability (measured max 0.006)."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from omni_mp.models.qwen3_omni.vllm_hooks_talker import sample_top_k_top_p

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 128, generator=gen) * torch.tensor([[0.5], [2.0], [4.0]])
    want = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(50)(None, logits.clone())).softmax(-1)
    draws = 20_000
    torch.manual_seed(0)
    got = sample_top_k_top_p(logits.repeat_interleave(draws, dim=0)).view(3, draws)
    freq = torch.stack([torch.bincount(row, minlength=128).float() / draws for row in got])
    assert bool(((freq > 0) <= (want > 0)).all())  # nothing outside the kept set
    assert float((freq - want).abs().max()) < 0.015


def test_sampled_request_beside_a_greedy_one(engine: Any) -> None:
    """A request whose talker samples (any temperature > 0: its code predictor samples too)
    in the same batches as a greedy one: the greedy one still equals generate frame for frame;
    the sampled one's frames are well-formed codes, and its first frame's groups 1..15 are not
    the greedy code predictor's (its temperature 1e-4 keeps group 0 of frame 0, drawn from the
    deterministic prefill, the greedy one)."""
    run = oracle("text")
    greedy = Talk(engine, "greedy", run, "Ethan", streamed=True)
    sampled = Talk(engine, "sampled", run, "Ethan", streamed=True, temperature=1e-4)
    talk(engine, [greedy, sampled], check=False)
    greedy.check()
    codes = codes_of_rows(torch.cat(sampled.rows))[sampled.prompt_len :]
    cp_vocab = omni_model(model_dir()).config.talker_config.code_predictor_config.vocab_size
    assert codes.shape[0] >= 1
    assert bool((codes[:, 1:] >= 0).all()) and bool((codes[:, 1:] < cp_vocab).all())
    assert torch.equal(codes[:, 0], torch.tensor(sampled.tokens[: codes.shape[0]]))
    assert int(codes[0, 0]) == int(run.codes[0, 0])
    assert not torch.equal(codes[0, 1:], run.codes[0, 1:])


def test_processor_refuses_bad_thinker_output() -> None:
    """Bad upstream data fails the request with a message naming what is wrong."""
    from omni_mp.models.processor import ProcessorError

    run = oracle("text")
    proc = processor()
    no_assistant = upstream(run)
    no_assistant.prompt_token_ids = run.prompt_ids[:-3]  # the generation prompt cut off
    with pytest.raises(ProcessorError, match="no '<\\|im_start\\|>assistant' turn"):
        proc.prompt({0: no_assistant}, RequestContext())
    bad_ids = upstream(run)
    bad_ids.output_token_ids = [10**6, *run.reply_ids[1:]]
    with pytest.raises(ProcessorError, match="outside the vocabulary"):
        proc.prompt({0: bad_ids}, RequestContext())
    media = upstream(oracle("image"))
    media.layers = {}
    with pytest.raises(ProcessorError, match=f"no layer-{proc.layer} rows"):
        proc.prompt({0: media}, RequestContext())

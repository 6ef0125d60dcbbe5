"""Our vLLM Qwen3-TTS talker (omni_mp.models.qwen3_tts.vllm_hooks_talker: a real in-process vLLM
CPU engine, the code predictor inside its step) fed the prompt and step rows of our prompt
builder (omni_mp.models.qwen3_tts.prompt), against the qwen-tts 0.1.1 reference (its own venv) on
the tiny CustomVoice and VoiceDesign checkpoints, fp32, greedy talker and code predictor, no
repetition penalty: every frame's 16 codes equal the reference's, for a preset voice with
instructions, the other prompt forms, a designed voice, a voice cloned from a clip's x-vector
(Base) alone or in context with the clip's text and codes, each in the whole-text and the
text-streaming mode (the reference's non_streaming_mode True and False; the text's rest given as
the request's step rows, StageInput.step_rows, as the entry stage gives them), and 8 requests run
concurrently.

The reference's `max_new_tokens = N` gives N - 1 frames (its last code 0 is never expanded); our
engine with `max_tokens = N` samples N codes 0 and completes N - 1 frames, the same ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from omni_mp.models.qwen3_omni.codes import NO_CODE, codes_of_rows
from omni_mp.models.qwen3_tts.prompt import TtsPromptBuilder, TtsRequest
from omni_mp.models.qwen3_tts.talker_view import SubtalkerSampling
from omni_mp.models.qwen3_tts.tiny import NARROW_SUBTALKER
from omni_mp.models.qwen3_tts.tiny_config import CODEC_SPECIAL_RANGE
from omni_mp.models.registry import builtin_model
from omni_mp.wire.messages import SamplingParamsMsg
from tests.launcher import engine_is_empty, in_process_engine, start_request
from tests.qwen3_tts_oracle import require_reference, run_reference, warped_scores

MAX_NEW = 12
VOICE = {"kind": "custom_voice", "text": "hello there, how are you?", "speaker": "vivian",
         "language": "english", "instruct": "speak slowly and warmly", "max_new_tokens": MAX_NEW}  # fmt: skip
CUSTOM = {
    "instructed": VOICE,
    "plain": {**VOICE, "instruct": ""},
    "ryan": {**VOICE, "speaker": "ryan", "text": "the quick brown fox"},
    "chinese": {**VOICE, "language": "chinese"},
    "dialect": {**VOICE, "speaker": "dylan", "language": "auto"},
    "text-streamed": {**VOICE, "non_streaming_mode": False},
}
DESIGNED = {"kind": "voice_design", "text": "good morning to you", "instruct": "a deep calm voice",
            "language": "english", "max_new_tokens": MAX_NEW}  # fmt: skip
DESIGN = {"designed": DESIGNED, "designed-text-streamed": {**DESIGNED, "non_streaming_mode": False}}


def _clip() -> np.ndarray:
    """A 2 s 24 kHz reference clip: a modulated 220 Hz tone."""
    t = np.arange(24000 * 2) / 24000
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


CLONE = {
    "in-context": {
        "kind": "clone_icl",
        "text": "good morning to you",
        "language": "auto",
        "ref_audio": _clip().tolist(),
        "ref_text": "the quick brown fox",
        "max_new_tokens": MAX_NEW,
    },
    "cloned": {
        "kind": "clone_xvector",
        "text": "hello there, how are you?",
        "language": "english",
        "ref_audio": _clip().tolist(),
        "max_new_tokens": MAX_NEW,
    },  # fmt: skip
}
# in context, the text streamed: zipped with the clip's 26 codec rows, shorter (padded) or longer (fed per step)
CLONE |= {
    "in-context-text-streamed": {**CLONE["in-context"], "non_streaming_mode": False},
    "in-context-text-streamed-long": {**CLONE["in-context"], "non_streaming_mode": False,
                                      "text": "good morning to you, " * 4},
}  # fmt: skip


def _request(req: dict, model_dir: Path | None = None, extras: dict | None = None) -> TtsRequest:
    embedding = ref_codes = None
    if req["kind"] == "clone_icl":  # the clip's codes as the reference's Mimi encoder made them
        assert extras is not None
        ref_codes = torch.from_numpy(extras["ref_codes"])
    if req["kind"] in ("clone_xvector", "clone_icl"):
        from omni_mp.models.qwen3_tts.speaker import SpeakerEncoder

        assert model_dir is not None
        embedding = SpeakerEncoder(model_dir).embed(torch.tensor(req["ref_audio"]))
    return TtsRequest(
        speaker_embedding=embedding,
        ref_codes=ref_codes,
        ref_text=req.get("ref_text"),
        text=req["text"],
        voice=req.get("speaker") if req["kind"] == "custom_voice" else None,
        language=req.get("language", "auto"),
        instructions=req.get("instruct") or "",
        text_streaming=not req.get("non_streaming_mode", True),
    )


class Case:
    def __init__(self, model_dir: Path, req: dict, codes: np.ndarray, extras: dict) -> None:
        self.model_dir, self.req, self.want, self.extras = model_dir, req, torch.from_numpy(codes), extras


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    require_reference()
    out: dict[str, Case] = {}
    named = (
        ("tiny-qwen3-tts-custom-voice", CUSTOM),
        ("tiny-qwen3-tts-voice-design", DESIGN),
        ("tiny-qwen3-tts-base", CLONE),
    )
    for name, reqs in named:
        model_dir = builtin_model(name)
        run = run_reference(model_dir, list(reqs.values()))
        assert run.report["errors"] == {}
        out |= {k: Case(model_dir, r, run.codes[i], run.extras[i]) for i, (k, r) in enumerate(reqs.items())}
    return out


def _engine(name: str) -> Iterator[Any]:
    from omni_mp.engines.ar import EngineFeatures
    from omni_mp.models.qwen3_tts.vllm_hooks_talker import talker_engine_model

    em = talker_engine_model(
        str(builtin_model(name)), {"dtype": "float32", "enforce_eager": True, "max_model_len": 512}
    )
    features = EngineFeatures(hidden_states=True, prompt_embeds=True, step_embeds=True)
    t0 = time.monotonic()
    # 64 sequences: a prompt fits in max_num_seqs rows (what test_a_prompt_step_runs_no_code_predictor checks)
    with in_process_engine(em.model, {**em.engine_args, "max_num_seqs": 64}, features) as eng:
        print(f"\n[tts talker] engine init {time.monotonic() - t0:.1f}s")
        yield eng


@pytest.fixture(scope="module")
def custom_engine() -> Iterator[Any]:
    yield from _engine("tiny-qwen3-tts-custom-voice")


@pytest.fixture(scope="module")
def design_engine() -> Iterator[Any]:
    yield from _engine("tiny-qwen3-tts-voice-design")


class Talk:
    """One request as the entry stage runs it: prompt rows, its step rows given with it, then T(tts_pad)."""

    def __init__(self, engine: Any, rid: str, case: Case) -> None:
        builder = _builder(case.model_dir)
        rows = builder.rows(_request(case.req, case.model_dir, case.extras))
        t = builder.talker_config
        vocab, eos = int(t["vocab_size"]), int(t["codec_eos_token_id"])
        self.rid, self.case, self.prompt_len = rid, case, rows.prompt.shape[0]
        sampling = SamplingParamsMsg(max_tokens=MAX_NEW, stop_token_ids=[eos], temperature=0.0, seed=7)
        start_request(
            engine, rid, sampling,
            prompt_embeds=rows.prompt, prompt_token_ids=[int(t["codec_pad_id"])] * self.prompt_len,
            step_rows=rows.steps, step_fill=rows.pad,
            suppress_token_ids=[i for i in range(vocab - CODEC_SPECIAL_RANGE, vocab) if i != eos],
        )  # fmt: skip
        self.tokens: list[int] = []
        self.rows: list[torch.Tensor] = []
        self.finished = False

    def take(self, out: Any) -> None:
        self.tokens += out.new_token_ids
        if out.hidden is not None:
            self.rows.append(out.hidden.last)
        self.finished = self.finished or out.finished

    def check(self) -> None:
        codes = codes_of_rows(torch.cat(self.rows))
        want = self.case.want
        assert bool((codes[: self.prompt_len] == NO_CODE).all())
        assert torch.equal(codes[self.prompt_len :], want), (self.rid, codes[self.prompt_len :], want)
        assert self.tokens[: want.shape[0]] == want[:, 0].tolist()


_BUILDERS: dict[Path, TtsPromptBuilder] = {}


def _builder(model_dir: Path) -> TtsPromptBuilder:
    if model_dir not in _BUILDERS:
        _BUILDERS[model_dir] = TtsPromptBuilder(model_dir)
    return _BUILDERS[model_dir]


def talk(engine: Any, talks: list[Talk], max_steps: int = 400) -> None:
    by_id = {t.rid: t for t in talks}
    for _ in range(max_steps):
        if all(t.finished for t in talks):
            break
        outputs, _ = engine.step()
        assert not engine.take_failed()
        for out in outputs:
            by_id[out.request_id].take(out)
    else:
        raise AssertionError("talker requests did not finish")
    engine.step()  # the scheduler drops finished requests on its next pass
    assert engine_is_empty(engine)
    for t in talks:
        t.check()


@pytest.mark.parametrize("name", list(CUSTOM))
def test_codes_equal_the_reference_custom_voice(custom_engine: Any, cases: dict[str, Case], name: str) -> None:
    talk(custom_engine, [Talk(custom_engine, name, cases[name])])


@pytest.mark.parametrize("name", list(DESIGN))
def test_codes_equal_the_reference_voice_design(design_engine: Any, cases: dict[str, Case], name: str) -> None:
    talk(design_engine, [Talk(design_engine, name, cases[name])])


@pytest.fixture(scope="module")
def base_engine() -> Iterator[Any]:
    yield from _engine("tiny-qwen3-tts-base")


@pytest.mark.parametrize("name", list(CLONE))
def test_codes_equal_the_reference_cloned_voice(base_engine: Any, cases: dict[str, Case], name: str) -> None:
    """Base cloning: our speaker encoder's x-vector in the speaker slot; in context, the clip's
    text and codes (the reference's Mimi codes: our encoder of them is not there yet) too."""
    talk(base_engine, [Talk(base_engine, name, cases[name])])


@pytest.mark.parametrize("subtalker", [SubtalkerSampling(), NARROW_SUBTALKER], ids=["defaults", "narrow-tiny"])
def test_code_predictor_sampling_matches_the_references_warpers(subtalker: SubtalkerSampling) -> None:
    """Our code predictor's draw with the reference's `subtalker_*` settings (its defaults: top-k
    50, temperature 0.9, no top-p; the narrow tiny's: top-k 12, top-p 0.95, temperature 0.5)
    against the distribution transformers' warpers give for them on the same logits (the
    reference's generate adds those warpers): 20,000 draws per row, every code's frequency within
    0.015 of its probability (measured max 0.0045), nothing outside the kept set."""
    from omni_mp.models.qwen3_omni.vllm_hooks_talker import sample_top_k_top_p
    from omni_mp.models.qwen3_tts.vllm_hooks_talker import code_sampling

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 128, generator=gen) * torch.tensor([[0.5], [2.0], [4.0]])
    want = warped_scores(logits, msgspec.to_builtins(subtalker)).softmax(-1).float()
    draws = 20_000
    torch.manual_seed(0)
    got = sample_top_k_top_p(logits.repeat_interleave(draws, dim=0), code_sampling(subtalker)).view(3, draws)
    freq = torch.stack([torch.bincount(row, minlength=128).float() / draws for row in got])
    assert bool(((freq > 0) <= (want > 0)).all())
    print(f"\n[tts sampler] max |freq - p| {float((freq - want).abs().max()):.4f}")
    assert float((freq - want).abs().max()) < 0.015


def test_eight_concurrent_requests_each_equal_their_reference(custom_engine: Any, cases: dict[str, Case]) -> None:
    names = [*CUSTOM, "instructed", "ryan"]  # 8, two of them twice
    talk(custom_engine, [Talk(custom_engine, f"{n}-{i}", cases[n]) for i, n in enumerate(names)])


def test_the_text_modes_give_other_codes(cases: dict[str, Case]) -> None:
    """The comparisons above can tell the modes apart: the reference's codes differ between them."""
    pairs = [("instructed", "text-streamed"), ("designed", "designed-text-streamed"),
             ("in-context", "in-context-text-streamed"), ("in-context", "in-context-text-streamed-long")]  # fmt: skip
    for whole, streamed in pairs:
        assert not torch.equal(cases[whole].want, cases[streamed].want), (whole, streamed)


def _cp_rows_last(worker: Any) -> int:
    return int(worker.model_runner.get_model().cp_rows_last)


def test_a_prompt_step_runs_no_code_predictor(custom_engine: Any, cases: dict[str, Case]) -> None:
    """A forward run in Python (every forward of this eager engine; on a GPU, each that no FULL
    graph replays) runs the code predictor on the rows that complete a frame only: none in the
    prompt step, though the prompt fits in max_num_seqs rows (where it had run every row, as
    padding), one in each decode step of one request. The codes still equal the reference's."""
    name = next(iter(CUSTOM))
    t = Talk(custom_engine, "cp-rows", cases[name])
    assert t.prompt_len <= 64
    rows: list[int] = []
    while not t.finished:
        outputs, _ = custom_engine.step()
        rows.append(custom_engine.driver.core.model_executor.collective_rpc(_cp_rows_last)[0])
        for out in outputs:
            t.take(out)
        assert len(rows) < 400
    custom_engine.step()
    assert engine_is_empty(custom_engine)
    t.check()
    assert rows[0] == 0 and set(rows[1:]) == {1}, rows

"""The Qwen2.5-Omni talker on vLLM (our registered model, loaded from a talker view of the tiny
omni checkpoint) against transformers' `Qwen2_5OmniTalkerForConditionalGeneration` run by hand
on the same checkpoint: fp32, greedy, real in-process vLLM CPU engine.

The talker inputs are built as transformers' `generate()` builds them (facts §2, transformers
5.17): prefill rows [L+2, E] from the thinker's embeddings and last hidden states, codec
pad/bos added to rows L and L+1, then one stream row per decode step."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from omni_mp.engines.base import Extension
from omni_mp.models.registry import resolve_model
from omni_mp.wire.messages import SamplingParamsMsg
from tests.hf_oracle import assert_same_tokens
from tests.launcher import engine_is_empty, in_process_engine, start_request

pytestmark = pytest.mark.engine

CKPT = "tiny-token2wav"
PAD, BOS, END, MASK = 122, 123, 124, 126  # codec ids of the tiny talker
TEXT_EOS, TEXT_PAD = 308, 309  # tts_text_end/pad (thinker vocab)
VISION_START, IMAGE, VISION_END = 303, 301, 304
E, VC = 64, 128
PENALTY = 1.05
RTOL, ATOL = 1e-4, 1e-4


@functools.cache
def omni() -> Any:
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(resolve_model(CKPT), dtype=torch.float32).eval()


@torch.no_grad()
def talker_inputs(prompt_ids: list[int], n_thinker: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prefill [L+2, E], stream rows [N, E], fill [E]) from the HF thinker, as generate() does."""
    from transformers import GenerationConfig

    model = omni()
    thinker, talker = model.thinker, model.talker
    ids = torch.tensor([prompt_ids])
    cfg = GenerationConfig(
        max_new_tokens=n_thinker,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_hidden_states=True,
        return_dict_in_generate=True,
    )
    out = thinker.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    y = out.sequences[0, len(prompt_ids) :]
    assert y.shape[0] == n_thinker
    last = torch.cat([step[-1][0] for step in out.hidden_states])  # [L + N - 1, Ht]
    embed_t = thinker.get_input_embeddings()
    codec = talker.get_input_embeddings()
    L = len(prompt_ids)
    prompt_rows = embed_t(ids[0]) + last[:L]
    r = embed_t(y[:-1]) + last[L:]  # r_j for j = 0..N-2 (y_{N-1} is never fed back)
    spk_bos = model.speaker_map["Chelsie"]["bos_token"]
    row_l = embed_t(torch.tensor([spk_bos]))[0] + codec(torch.tensor([PAD]))[0]
    row_l1 = r[0] + codec(torch.tensor([BOS]))[0]
    prefill = torch.cat([prompt_rows, row_l[None], row_l1[None]])
    fill = embed_t(torch.tensor([TEXT_PAD]))[0]
    stream = torch.cat([r[1:], embed_t(torch.tensor([TEXT_EOS])), fill[None]])
    return prefill, stream, fill


@torch.no_grad()
def hf_talker(
    prefill: torch.Tensor,
    stream: torch.Tensor,
    fill: torch.Tensor,
    n: int,
    positions: torch.Tensor | None = None,
    delta: int = 0,
    suppress: tuple[int, ...] = (BOS,),
) -> tuple[list[int], list[float], list[torch.Tensor]]:
    """transformers' talker by hand (KV cache): proj, talker.model, codec_head; repetition penalty
    over [mask]*L + [pad, bos] + generated, `suppress` (generate's: bos) at -inf, greedy; stop at
    pad/end (the stop code is kept, as vLLM reports it). Returns codes, top-2 margins and the raw
    logits of each step."""
    talker = omni().talker
    n_prompt = prefill.shape[0]
    if positions is None:
        positions = torch.arange(n_prompt).expand(3, n_prompt)
    seen = [MASK] * (n_prompt - 2) + [PAD, BOS]
    out = talker.model(
        inputs_embeds=talker.thinker_to_talker_proj(prefill)[None], position_ids=positions[:, None], use_cache=True
    )
    codes: list[int] = []
    margins: list[float] = []
    raw: list[torch.Tensor] = []
    for k in range(n):
        logits = talker.codec_head(out.last_hidden_state[0, -1]).float()
        raw.append(logits.clone())
        ids = torch.tensor(seen)
        score = logits[ids]
        logits[ids] = torch.where(score < 0, score * PENALTY, score / PENALTY)
        logits[list(suppress)] = -float("inf")
        top = logits.topk(2).values
        margins.append(float(top[0] - top[1]))
        code = int(logits.argmax())
        codes.append(code)
        seen.append(code)
        if code in (PAD, END) or k == n - 1:
            break
        x = talker.get_input_embeddings()(torch.tensor([code]))[0] + (stream[k] if k < stream.shape[0] else fill)
        pos = torch.full((3, 1, 1), n_prompt + k + delta)
        out = talker.model(
            inputs_embeds=talker.thinker_to_talker_proj(x)[None, None],
            position_ids=pos,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return codes, margins, raw


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from omni_mp.engines.ar import AREngine, EngineFeatures
    from omni_mp.models.qwen2_5_omni.talker_view import talker_view_dir
    from omni_mp.models.qwen2_5_omni.vllm_hooks_talker import register_talker

    register_talker()
    view = talker_view_dir(resolve_model(CKPT))
    args = {
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": 512,
        "max_num_seqs": 4,
        "skip_tokenizer_init": True,  # codec ids are not text; the view has no tokenizer
        "max_logprobs": VC,  # the tests read every step's raw logits
        "logprobs_mode": "raw_logits",
    }
    t0 = time.monotonic()
    with in_process_engine(str(view), args, EngineFeatures(prompt_embeds=True, step_embeds=True)) as eng:
        print(f"\n[talker] engine init {time.monotonic() - t0:.1f}s")

        def with_logprobs(p: SamplingParamsMsg, only: list[int] | None = None) -> Any:
            params = AREngine.to_vllm_sampling(eng, p, only)
            params.logprobs = VC
            return params

        eng.to_vllm_sampling = with_logprobs
        yield eng


def drive(engine: Any, rid: str, max_steps: int = 200) -> tuple[list[int], list[torch.Tensor]]:
    """Step the engine until `rid` finishes, like AREngine.step but keeping each step's raw
    logits (vLLM logprobs with logprobs_mode raw_logits, all VC of them)."""
    codes: list[int] = []
    raw: list[torch.Tensor] = []
    for _ in range(max_steps):
        outputs, _ = engine.driver.step()
        for out in outputs:
            assert out.request_id == rid
            codes += out.new_token_ids
            lp = out.new_logprobs
            for ids, vals in zip(lp.logprob_token_ids, lp.logprobs, strict=True):
                full = torch.full((VC,), float("nan"))
                full[torch.as_tensor(ids[1:])] = torch.as_tensor(vals[1:])  # [0] is the sampled code
                raw.append(full)
            if out.finished:
                engine.io.release(rid)
                return codes, raw
    raise AssertionError(f"{rid} did not finish in {max_steps} steps")


def sampling(n: int, suppress: tuple[int, ...] = (BOS,)) -> SamplingParamsMsg:
    return SamplingParamsMsg(
        max_tokens=n, repetition_penalty=PENALTY, stop_token_ids=[PAD, END], suppress_token_ids=list(suppress)
    )


def run_vllm(
    engine: Any,
    rid: str,
    prefill: torch.Tensor,
    stream: torch.Tensor,
    fill: torch.Tensor,
    n: int,
    positions: tuple[torch.Tensor, int] | None = None,
) -> tuple[list[int], list[torch.Tensor]]:
    n_prompt = prefill.shape[0]
    start_request(
        engine,
        rid,
        sampling(n),
        prompt_embeds=prefill,
        prompt_token_ids=[MASK] * (n_prompt - 2) + [PAD, BOS],
        step_embeds=True,
        step_fill=fill,
        positions=positions,
    )
    engine.extend(rid, Extension(step_rows=stream, closed=True))
    return drive(engine, rid)


def compare_logits(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> float:
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, want, strict=False)):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL, msg=lambda m, k=k: f"{what}, step {k}: {m}")
        worst = max(worst, float((g - w).abs().max()))
    return worst


@pytest.mark.parametrize(
    ("prompt_ids", "n_thinker", "stops"),
    [
        ([5, 17, 42, 99, 7, 250, 3, 64], 12, False),  # 60 codes: outlives the 11 stream rows, then the fill
        ([286, 238, 231, 260, 97, 94, 262, 243, 95, 48], 8, True),  # stops at codec_pad after 23 codes
    ],
)
def test_talker_codes_equal_transformers(engine: Any, prompt_ids: list[int], n_thinker: int, stops: bool) -> None:
    prefill, stream, fill = talker_inputs(prompt_ids, n_thinker)
    assert prefill.shape == (len(prompt_ids) + 2, E)
    n = 60
    want, margins, want_raw = hf_talker(prefill, stream, fill, n)
    got, got_raw = run_vllm(engine, f"t{len(prompt_ids)}", prefill, stream, fill, n)
    print(f"\n[talker] {len(want)} codes, min top-2 margin {min(margins):.2e}, tail {want[-3:]}")
    assert_same_tokens(got, want, margins, "vLLM talker")
    assert (want[-1] in (PAD, END)) == stops and BOS not in want
    worst = compare_logits(got_raw, want_raw, "raw logits")
    print(f"[talker] max |logit diff| over {len(got_raw)} steps: {worst:.2e}")
    engine.step()  # the scheduler drops finished requests on its next pass
    assert engine_is_empty(engine)


def test_positions_override_gives_the_thinker_multimodal_positions(engine: Any) -> None:
    """An image-like prompt: the thinker's 3D positions for its L prompt rows (HF get_rope_index
    with a fabricated image_grid_thw), passed with the talker request; the two extra prompt rows
    and every decode step continue at index + delta, as HF's talker computes over L+2 ids."""
    model = omni()
    prompt_ids = [5, 17, VISION_START] + [IMAGE] * 16 + [VISION_END, 42, 99, 7]  # grid 1x8x8 / merge 2 = 16
    grid = torch.tensor([[1, 8, 8]])
    L = len(prompt_ids)
    ids = torch.tensor([prompt_ids])
    thinker_pos, thinker_delta = model.thinker.get_rope_index(ids, grid, None, torch.ones_like(ids))
    talker_ids = torch.tensor([prompt_ids + [310, 20]])  # + speaker bos, y_0
    talker_pos, talker_delta = model.talker.get_rope_index(talker_ids, grid, None, torch.ones_like(talker_ids))
    delta = int(thinker_delta[0, 0])
    assert delta == int(talker_delta[0, 0]) < 0  # an 8x8 grid spans fewer positions than its 16 tokens
    assert torch.equal(talker_pos[:, 0, :L], thinker_pos[:, 0])
    g = torch.Generator().manual_seed(3)
    prefill = torch.randn(L + 2, E, generator=g)
    stream = torch.randn(40, E, generator=g)
    fill = torch.randn(E, generator=g)
    n = 24
    want, margins, want_raw = hf_talker(prefill, stream, fill, n, talker_pos[:, 0], delta)
    got, got_raw = run_vllm(engine, "img", prefill, stream, fill, n, positions=(thinker_pos[:, 0], delta))
    assert_same_tokens(got, want, margins, "vLLM talker with 3D positions")
    worst = compare_logits(got_raw, want_raw, "raw logits with 3D positions")
    print(f"\n[talker] 3D positions: {len(got)} codes, max |logit diff| {worst:.2e}")
    # The override matters: with plain text positions the first logits already differ beyond the tolerance.
    _, _, text_raw = hf_talker(prefill, stream, fill, 1)
    assert not torch.allclose(text_raw[0], want_raw[0], rtol=RTOL, atol=ATOL)


def test_each_request_suppresses_its_own_ids_through_batch_changes(engine: Any) -> None:
    """Suppressed ids go to the runner's logits processor (vllm_hooks_sampling), one mask row per
    request. Three requests at once, each suppressing, besides bos, the codes it writes most
    without them (so its greedy path changes), of different lengths: the shortest finishes
    first and the batch moves the others' rows; a fourth then joins with yet other ids. Each
    one's codes equal transformers' with its own ids at -inf."""
    prompts = [[5, 17, 42, 99, 7, 250, 3, 64], [286, 238, 231, 260, 97], [11, 23, 5, 77, 301, 290, 8], [40, 41, 42]]
    lengths = [8, 30, 20, 16]
    runs: list[dict[str, Any]] = []
    for k, (ids, n) in enumerate(zip(prompts, lengths, strict=True)):
        prefill, stream, fill = talker_inputs(ids, 8)
        free, _, _ = hf_talker(prefill, stream, fill, n)
        top = sorted(set(free), key=lambda c: (-free.count(c), c))[: 1 + k % 3]
        suppress = tuple(sorted({BOS, *top}))
        want, margins, _ = hf_talker(prefill, stream, fill, n, suppress=suppress)
        assert want != free and not set(want) & set(suppress)  # the suppressed ids changed the path
        runs.append(
            {"rid": f"s{k}", "inputs": (prefill, stream, fill), "n": n, "suppress": suppress, "want": want,
             "margins": margins}
        )  # fmt: skip

    def start(run: dict[str, Any]) -> None:
        prefill, stream, fill = run["inputs"]
        L = prefill.shape[0]
        start_request(
            engine, run["rid"], sampling(run["n"], run["suppress"]), prompt_embeds=prefill,
            prompt_token_ids=[MASK] * (L - 2) + [PAD, BOS], step_embeds=True, step_fill=fill,
        )  # fmt: skip
        engine.extend(run["rid"], Extension(step_rows=stream, closed=True))

    assert len(runs[0]["want"]) < min(len(run["want"]) for run in runs[1:3])  # s0 leaves first
    for run in runs[:3]:
        start(run)
    got: dict[str, list[int]] = {run["rid"]: [] for run in runs}
    done: list[str] = []
    for _ in range(200):
        outputs, _ = engine.step()
        for out in outputs:
            got[out.request_id] += out.new_token_ids
            if out.finished:
                done.append(out.request_id)
                if len(done) == 1:
                    start(runs[3])  # joins the running batch in the freed row
        if len(done) == len(runs):
            break
    assert done[0] == "s0" and sorted(done) == [run["rid"] for run in runs]
    for run in runs:
        assert_same_tokens(got[run["rid"]], run["want"], run["margins"], f"{run['rid']} suppressing {run['suppress']}")
    engine.step()
    assert engine_is_empty(engine)


def test_wrong_inputs_are_refused_with_the_reason(engine: Any) -> None:
    from omni_mp.engines.base import EngineInputError

    with pytest.raises(EngineInputError, match=r"prompt_embeds: expected \[n, 64\] \(the model.s input-embedding"):
        start_request(engine, "w", sampling(4), prompt_embeds=torch.zeros(5, 96))
    with pytest.raises(EngineInputError, match=r"4 ids for 5 rows"):
        start_request(engine, "w", sampling(4), prompt_embeds=torch.zeros(5, E), prompt_token_ids=[MASK] * 4)
    with pytest.raises(EngineInputError, match=r"positions: expected \[3, P\] with 0 < P <= 5"):
        start_request(
            engine,
            "w",
            sampling(4),
            prompt_embeds=torch.zeros(5, E),
            positions=(torch.zeros(3, 6, dtype=torch.long), 0),
        )
    start_request(engine, "w", sampling(2), prompt_embeds=torch.zeros(5, E), step_embeds=True)
    with pytest.raises(EngineInputError, match=r"step embeddings: expected \[n, 64\]"):
        engine.extend("w", Extension(step_rows=torch.zeros(2, 96)))
    engine.abort(["w"])
    with pytest.raises(EngineInputError, match=r"suppress_token_ids: \[128, 500\] outside the vocabulary of 128"):
        start_request(engine, "w2", sampling(4, (BOS, 500, 128)), prompt_embeds=torch.zeros(5, E))
    engine.step()
    assert engine_is_empty(engine)


def test_talker_view_config() -> None:
    import json

    from omni_mp.models.qwen2_5_omni.talker_view import TALKER_ARCH, talker_view_dir

    view = talker_view_dir(resolve_model(CKPT))
    assert talker_view_dir(resolve_model(CKPT)) == view  # cached
    cfg = json.loads((view / "config.json").read_text())
    assert cfg["architectures"] == [TALKER_ARCH] and cfg["model_type"] == "qwen2_5_omni_talker"
    assert cfg["projection_size"] == cfg["embedding_size"] == E and cfg["hidden_size"] == 96 and cfg["head_dim"] == 32
    assert (view / "model.safetensors").resolve() == (Path(resolve_model(CKPT)) / "model.safetensors").resolve()


def test_a_capturing_stage_ships_its_prompt_positions() -> None:
    """The source side: a stage that captures hidden states on an M-RoPE model ships each
    request's prompt positions with its first captured rows (a thinker's go to the talker).
    vLLM's Qwen2.5-Omni thinker needs torchvision, which this venv lacks, so the M-RoPE model
    here is the talker itself; for a text prompt the positions are arange on all axes, delta 0."""
    from omni_mp.engines.ar import EngineFeatures
    from omni_mp.models.qwen2_5_omni.talker_view import talker_view_dir
    from omni_mp.models.qwen2_5_omni.vllm_hooks_talker import register_talker

    register_talker()
    args = {"dtype": "float32", "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 2}
    args["skip_tokenizer_init"] = True
    view = str(talker_view_dir(resolve_model(CKPT)))
    L = 9
    with in_process_engine(view, args, EngineFeatures(hidden_states=True, prompt_embeds=True)) as eng:
        assert eng.uses_mrope
        g = torch.Generator().manual_seed(5)
        start_request(
            eng, "src", SamplingParamsMsg(max_tokens=4, ignore_eos=True), prompt_embeds=torch.randn(L, E, generator=g)
        )
        rows: list[Any] = []
        while not engine_is_empty(eng):
            outs, _ = eng.step()
            rows += [o.hidden for o in outs if o.hidden is not None]
        assert not eng.io.requests  # the request's hook state went with it
    assert [r.start for r in rows] == [0, L, L + 1, L + 2]
    assert [r.last.shape[0] for r in rows] == [L, 1, 1, 1]  # 4 forwards: the last code is never fed back
    assert rows[0].mrope is not None and all(r.mrope is None for r in rows[1:])
    pos, delta = rows[0].mrope.positions, rows[0].mrope.delta
    assert delta == 0 and torch.equal(pos, torch.arange(L).expand(3, L))

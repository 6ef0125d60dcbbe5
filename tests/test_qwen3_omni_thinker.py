"""The Qwen3-Omni thinker stage (tests/configs/tiny_qwen3_omni_thinker.yaml): a real launcher
process running vLLM's thinker (our subclass, omni_mp.models.qwen3_omni.vllm_hooks_thinker)
on the tiny checkpoint, against transformers' `Qwen3OmniMoeForConditionalGeneration.thinker`
on the same checkpoint (fp32, greedy): the reply tokens, and what the stage exports to the
talker (omni_mp.models.qwen3_omni.exports): the rows of layer `accept_hidden_layer` and of
the last layer for every token the thinker computed, and its M-RoPE prompt positions.

Tolerances, measured on this machine: rows within 4e-6 of transformers (ATOL 1e-4);
positions exact. Every compared step has a transformers top-2 margin above MIN_MARGIN, so
equal tokens are not luck."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.models.qwen3_omni.exports import ThinkerTurns, TurnIds, accept_hidden_layer
from omni_mp.models.registry import resolve_model
from omni_mp.wire.messages import Finished, SamplingParamsMsg, StageOutputChunk
from tests.hf_oracle import assert_same_tokens
from tests.hf_oracle_qwen3_omni import omni_inputs, omni_model, thinker_generate
from tests.launcher import REPO, ServedPipeline, serve, settled_client
from tests.synthetic_media import pattern, tone

pytestmark = pytest.mark.engine

CONFIG = REPO / "tests" / "configs" / "tiny_qwen3_omni_thinker.yaml"
TOKENS = 16  # the stage's max_tokens (ignore_eos) in the YAML
ATOL = 1e-4
MIN_MARGIN = 1e-5

# Audio of whole 160-sample hops (see omni_mp.models.qwen3_omni.prompt), at the processor's rate.
CASES: dict[str, dict[str, Any]] = {
    "text": dict(text="Tell me a short story about the sea."),
    "audio": dict(text="What do you hear?", audio=tone(1.0)),
    "image": dict(text="Describe the picture.", image=pattern(64)),
    "audio+image": dict(text="What do you hear and see?", audio=tone(0.6), image=pattern(96)),
}


def _model() -> str:
    return str(resolve_model("tiny-qwen3-omni"))


def _config() -> dict[str, Any]:
    return json.loads((Path(_model()) / "config.json").read_text())


@pytest.fixture(scope="module")
def pipeline() -> Iterator[ServedPipeline]:
    with serve(CONFIG) as served:
        yield served


@pytest.fixture
def client(pipeline: ServedPipeline) -> Iterator[OmniClient]:
    with settled_client(pipeline.endpoint) as c:
        yield c  # type: ignore[misc]


class Streamed:
    """What the thinker stage streamed for one request."""

    def __init__(self, events: list[StageOutputChunk | Finished], layer: int) -> None:
        self.prompt_ids: list[int] | None = None
        self.tokens: list[int] = []
        last: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        self.mrope: tuple[torch.Tensor, int] | None = None
        for ev in events:
            if not isinstance(ev, StageOutputChunk):
                continue
            if ev.prompt_token_ids is not None:
                self.prompt_ids = list(ev.prompt_token_ids)
            self.tokens += ev.token_ids
            h = ev.hidden
            if h is None:
                continue
            assert h.start == sum(r.shape[0] for r in last), "hidden rows out of order"
            if h.mrope is not None:
                self.mrope = (h.mrope.positions.clone(), h.mrope.delta)
            last.append(h.last.clone())
            (lr,) = [lr for lr in h.layers if lr.layer == layer]
            rows.append(lr.rows.clone())
        self.last = torch.cat(last)
        self.layer = torch.cat(rows)


def _stream(client: OmniClient, case: dict[str, Any], **kw: Any) -> Streamed:
    events = list(
        client.stream(
            case["text"],
            audios=[(torch.from_numpy(case["audio"]), 16_000)] if "audio" in case else [],
            images=[torch.from_numpy(case["image"])] if "image" in case else [],
            deadline_s=600,
            hidden_states=True,
            **kw,
        )
    )
    return Streamed(events, accept_hidden_layer(_config()))


def _hf_positions(case: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """transformers' M-RoPE positions of the thinker prompt (`get_rope_index`)."""
    inputs = omni_inputs(_model(), case["text"], case.get("audio"), case.get("image"))
    mask = inputs.get("feature_attention_mask")
    pos, delta = omni_model(_model()).thinker.get_rope_index(
        inputs["input_ids"],
        inputs.get("image_grid_thw"),
        None,
        inputs["attention_mask"],
        False,
        None if mask is None else mask.sum(-1),
    )
    return pos[:, 0].to(torch.int64), int(delta.item())


def check(got: Streamed, case: dict[str, Any]) -> None:
    want = thinker_generate(_model(), case["text"], audio=case.get("audio"), image=case.get("image"), n=TOKENS)
    assert got.prompt_ids == want.prompt_ids
    assert_same_tokens(got.tokens, want.ids, want.margins, "thinker")
    assert min(want.margins) > MIN_MARGIN
    layer = accept_hidden_layer(_config())
    n = len(want.prompt_ids) + TOKENS - 1  # the prompt and every reply token but the last
    assert got.layer.shape == got.last.shape == (n, want.hidden[0].shape[1])
    torch.testing.assert_close(got.layer, want.hidden[layer], atol=ATOL, rtol=0)
    torch.testing.assert_close(got.last, want.hidden[-1], atol=ATOL, rtol=0)
    assert got.mrope is not None
    pos, delta = _hf_positions(case)
    assert torch.equal(got.mrope[0], pos) and got.mrope[1] == delta


@pytest.mark.parametrize("name", sorted(CASES))
def test_thinker_stage_equals_transformers(client: OmniClient, name: str) -> None:
    check(_stream(client, CASES[name]), CASES[name])


def test_eight_concurrent_requests_each_equal_transformers(client: OmniClient) -> None:
    names = [sorted(CASES)[i % len(CASES)] for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda name: _stream(client, CASES[name]), names))
    for name, streamed in zip(names, got, strict=True):
        check(streamed, CASES[name])


def test_text_embeddings_are_the_checkpoint_table_rows() -> None:
    """exports.py has the talker side take text embeddings from the thinker's table instead
    of streaming them: transformers' hidden_states[0] (what its talker reads) at every
    position but the media placeholders is exactly that table's row."""
    case = CASES["audio+image"]
    want = thinker_generate(_model(), case["text"], audio=case.get("audio"), image=case.get("image"), n=TOKENS)
    ids = torch.tensor(want.prompt_ids + want.ids[:-1])
    media = torch.isin(ids, torch.tensor(TurnIds.from_config(_config()).media))
    assert media.any() and not media.all()
    assert torch.equal(want.hidden[0][~media], want.embed_table[ids[~media]])


def test_thinker_turns_split_the_prompt_as_the_template_renders_it() -> None:
    """The user turn runs from its <|im_start|> to the assistant's; media positions are the
    placeholders the processor expanded; the assistant turn opens the prompt's last 3 ids."""
    case = CASES["audio+image"]
    ids = omni_inputs(_model(), case["text"], case["audio"], case["image"])["input_ids"][0].tolist()
    turn_ids = TurnIds.from_config(_config())
    turns = ThinkerTurns.of(ids, turn_ids)
    assert turns.assistant_start == len(ids) - 3
    assert ids[turns.assistant_start : turns.assistant_start + 2] == [turn_ids.im_start, turn_ids.assistant]
    assert turns.user == list(range(turns.assistant_start))  # no system turn: the user turn is all before
    assert turns.media == [i for i, t in enumerate(ids) if t in turn_ids.media]
    assert int(turns.media_mask().sum()) == len(turns.media) > 0


def test_bad_media_fail_only_that_request(client: OmniClient) -> None:
    with pytest.raises(RequestError, match=r"images\[0\]: expected uint8 \[height, width, 3\]"):
        client.generate("What is it?", images=[torch.zeros(8, 8, 3, dtype=torch.float32)], deadline_s=60)
    done = client.generate("Hello", sampling={0: SamplingParamsMsg(max_tokens=4, ignore_eos=True)}, deadline_s=60)
    assert len(done.outputs[0].token_ids) == 4

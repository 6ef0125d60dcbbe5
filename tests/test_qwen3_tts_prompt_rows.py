"""The Qwen3-TTS prompt's text rows T(id) = text_projection(text_embedding(id)) at the released
width (2048, random weights, a small text vocabulary): computed in fixed blocks and cached, a
row is the same bits whichever tokens shared its block and whatever requests came before; the
cache is bounded; the rows are the projection (against float64); a bad id is a clear error.
The prompt as a whole against the reference: tests/test_qwen3_tts_oracle.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.tts_prompt_rows import write_text_tables
from omni_mp.models.qwen3_tts import prompt
from omni_mp.models.qwen3_tts.prompt import TtsPromptBuilder, TtsPromptError

HIDDEN = 2048  # the released talker's width ([V] docs/qwen3_tts.md)
TEXT_VOCAB = 600


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tts_rows")
    write_text_tables(d, TEXT_VOCAB, HIDDEN)
    return d


def _builder(model_dir: Path) -> TtsPromptBuilder:
    return TtsPromptBuilder(model_dir, tokenizer=object())  # rows by id: no tokenizer needed


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_does_not_depend_on_its_block_or_the_requests_before(model_dir: Path, threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fresh = _builder(model_dir).text_rows([40, 41, 42])
        history = _builder(model_dir)
        history.text_rows(list(range(100, 137)))  # 37 other tokens first: blocks of 16, 16, 5
        history.text_rows([500, 42, 7])  # 42 in a block with other tokens, at another place
        again = history.text_rows([40, 41, 42])
        assert torch.equal(fresh, again)
        alone = _builder(model_dir).text_rows([42])[0]
        assert torch.equal(alone, fresh[2])
    finally:
        torch.set_num_threads(before)


def test_rows_are_the_projection(model_dir: Path) -> None:
    b = _builder(model_dir)
    ids = [5, 9, 5, 17] + list(range(200, 230))  # repeats, and more than one block
    got = b.text_rows(ids)
    p = {k: v.double() for k, v in b.proj.items()}
    x = b.text_embed[torch.tensor(ids)].double()
    hidden = torch.nn.functional.silu(x @ p["linear_fc1.weight"].T + p["linear_fc1.bias"])
    want = hidden @ p["linear_fc2.weight"].T + p["linear_fc2.bias"]
    assert got.shape == (len(ids), HIDDEN) and got.dtype == torch.float32
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(got[0], got[2])
    assert b.text_rows([]).shape == (0, HIDDEN)


def test_the_cache_is_bounded_and_an_evicted_row_comes_back_the_same(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prompt, "TEXT_ROWS_CACHE_BYTES", 20 * 4 * HIDDEN)  # 20 rows
    b = _builder(model_dir)
    assert b._rows_max == 20
    first = b.text_rows([300])
    for start in range(301, 400, 11):
        b.text_rows(list(range(start, start + 11)))
        assert len(b._rows) <= 20
    assert 300 not in b._rows  # the least recently used went first
    assert torch.equal(b.text_rows([300]), first)
    b.text_rows(list(range(400, 450)))  # more tokens in one request than the bound: all returned
    assert len(b._rows) == 20


def test_an_id_outside_the_text_vocabulary_is_named(model_dir: Path) -> None:
    b = _builder(model_dir)
    with pytest.raises(TtsPromptError, match=f"\\[{TEXT_VOCAB}\\]"):
        b.text_rows([3, TEXT_VOCAB])
    assert torch.equal(b.text_rows([3]), _builder(model_dir).text_rows([3]))  # the builder still works

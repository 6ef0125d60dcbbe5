"""A message that cannot be encoded fails its own request(s), never the process sending it:
which chunks of a step's batch break the limits (codec), and a real stage whose final text
outgrows `limits.max_string_length` (one tiny vLLM stage process, in-process coordinator)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgspec
import pytest
import torch

from omni_mp.client.omni_client import AsyncOmniClient, OmniClient, RequestError
from omni_mp.config.validate import load_config
from omni_mp.control.coordinator import Coordinator
from omni_mp.control.embedded import embedded_pipeline
from omni_mp.wire.codec import Limits, PayloadError, decode, encode, split_unsendable
from omni_mp.wire.messages import ErrorEvent, HiddenRows, SamplingParamsMsg, StageOutputBatch, StageOutputChunk
from tests.launcher import REPO

LIMITS = Limits(max_string_length=100, max_tensor_bytes=4096)


def chunk(rid: str, text: str | None = None, rows: int = 1) -> StageOutputChunk:
    hidden = HiddenRows(start=0, last=torch.ones(rows, 8))
    return StageOutputChunk(request_id=rid, stage_id=0, token_ids=[1], text=text, hidden=hidden)


def encode_error(msg: StageOutputBatch | ErrorEvent) -> PayloadError:
    with pytest.raises(PayloadError) as err:
        encode(msg, LIMITS)
    return err.value


def test_a_batch_keeps_the_chunks_within_the_limits_and_fails_the_others() -> None:
    batch = StageOutputBatch.pack([chunk("a"), chunk("b", text="x" * 101), chunk("c", rows=2)])
    rest, failed = split_unsendable(batch, encode_error(batch), LIMITS)
    assert list(failed) == ["b"] and "max_string_length=100" in failed["b"]
    assert isinstance(rest, StageOutputBatch)
    got = decode(encode(rest, LIMITS), LIMITS)
    assert isinstance(got, StageOutputBatch)
    chunks = got.unpacked()
    assert [c.request_id for c in chunks] == ["a", "c"]
    assert [c.hidden.last.shape[0] for c in chunks] == [1, 2]  # rows kept their owners
    assert all(c.hidden.packed is None for c in chunks)


def test_a_batch_too_large_as_a_whole_fails_every_request_in_it() -> None:
    """No chunk breaks a limit on its own, their packed rows do (4 x 1280 bytes > 4 KiB)."""
    chunks = [chunk(rid, rows=40) for rid in "abcd"]
    batch = StageOutputBatch.pack(chunks)
    rest, failed = split_unsendable(batch, encode_error(batch), LIMITS)
    assert rest is None and sorted(failed) == list("abcd")
    assert all("max_tensor_bytes=4096" in reason for reason in failed.values())


def test_another_message_fails_its_request_and_one_without_a_request_is_raised() -> None:
    error = ErrorEvent(request_id="r", stage_id=0, code="x", message="y" * 101)
    rest, failed = split_unsendable(error, encode_error(error), LIMITS)
    assert rest is None and list(failed) == ["r"]
    anonymous = msgspec.structs.replace(error, request_id=None)
    err = encode_error(anonymous)
    with pytest.raises(PayloadError):
        split_unsendable(anonymous, err, LIMITS)


# ---- a real stage -------------------------------------------------------------------------------
STRING_LIMIT = 400  # error messages (about 120 chars) and the short answers stay within it
LONG = {0: SamplingParamsMsg(max_tokens=1000, ignore_eos=True)}  # a final text of thousands of chars
SHORT = {0: SamplingParamsMsg(max_tokens=4, ignore_eos=True)}


@pytest.fixture(scope="module")
def coord() -> Iterator[Coordinator]:
    cfg = load_config(REPO / "tests" / "configs" / "tiny_single.yaml")
    cfg = msgspec.structs.replace(cfg, limits=msgspec.structs.replace(cfg.limits, max_string_length=STRING_LIMIT))
    with embedded_pipeline(cfg) as c:
        yield c


@pytest.mark.engine
def test_a_final_text_over_the_string_limit_fails_its_request_and_the_stage_keeps_serving(coord: Coordinator) -> None:
    async def both() -> list[object]:
        async with AsyncOmniClient(coord.client_endpoint) as client:
            long = client.generate("Tell me everything", sampling=LONG, deadline_s=300)
            short = client.generate("Hi", sampling=SHORT, deadline_s=300)
            return await asyncio.gather(long, short, return_exceptions=True)

    too_long, fine = asyncio.run(both())
    assert isinstance(too_long, RequestError), too_long
    assert too_long.code == "limit_exceeded" and too_long.stage_id == 0
    assert f"max_string_length={STRING_LIMIT}" in str(too_long)
    assert not isinstance(fine, BaseException), fine
    assert fine.outputs[-1].finish_reason == "length" and len(fine.outputs[-1].token_ids) == 4
    with OmniClient(coord.client_endpoint) as client:  # later requests are served by the same process
        later = client.generate("Again", sampling=SHORT, deadline_s=300)
        assert len(later.outputs[-1].token_ids) == 4
        (stage,) = client.status().stages
        assert stage.alive and stage.ready and stage.restarts == 0
        assert client.status().inflight == 0

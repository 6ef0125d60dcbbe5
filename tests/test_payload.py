"""Codec round trips (hypothesis, bit-exact) and adversarial inputs for omni_mp.wire.codec."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_mp.wire.codec import DEFAULT_LIMITS, Limits, PayloadError, decode, encode, validate
from omni_mp.wire.messages import (
    MESSAGE_TYPES,
    Abort,
    ErrorEvent,
    Finished,
    Heartbeat,
    HiddenRows,
    LayerRows,
    MessageBase,
    MRopePositions,
    PromptEmbeds,
    Ready,
    RowRange,
    SamplingParamsMsg,
    Shutdown,
    StageOutputBatch,
    StageOutputChunk,
    StageRequest,
    StageResult,
    TensorRef,
)
from omni_mp.wire.torch_tensors import TORCH_DTYPES as SUPPORTED_DTYPES


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def raw_frames(body: dict, *tensor_frames: bytes) -> list[bytes]:
    """A hand-made message, to say things the encoder refuses to say."""
    return [msgspec.msgpack.encode(body), *tensor_frames]


def request_body(**fields: object) -> dict:
    return {"t": "StageRequest", "request_id": "r-1", "stage_id": 0, **fields}


def ref(dtype: str, shape: list[int], nbytes: int, loc: object = 1) -> dict:
    return {"dtype": dtype, "shape": shape, "nbytes": nbytes, "loc": loc}


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = SUPPORTED_DTYPES[draw(st.sampled_from(sorted(SUPPORTED_DTYPES)))]
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    nbytes = math.prod(shape) * dtype.itemsize
    if dtype is torch.bool:
        data = bytes(draw(st.lists(st.integers(0, 1), min_size=nbytes, max_size=nbytes)))
    else:  # arbitrary bits: NaN payloads, infinities, denormals
        data = draw(st.binary(min_size=nbytes, max_size=nbytes))
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    t = flat.view(dtype).reshape(shape)
    if t.ndim >= 2 and draw(st.booleans()):
        t = t.transpose(0, 1)  # non-contiguous: encode must make it contiguous
    return t


@settings(max_examples=300, deadline=None)
@given(tensors(), st.integers(0, 4))
def test_tensor_round_trip_is_bit_exact(t: torch.Tensor, tokens: int) -> None:
    embeds = torch.zeros(tokens, 3, dtype=torch.bfloat16)
    msg = StageOutputChunk(
        request_id="req-1", stage_id=2, prompt_embeds=PromptEmbeds(embeds), additional_information={"x": t}
    )
    out = decode(encode(msg))
    assert same_bits(out.additional_information["x"], t)
    assert same_bits(out.prompt_embeds.data, embeds)


def test_batch_of_chunks_carries_and_checks_each_items_tensors() -> None:
    rows = [torch.randn(n, 8, dtype=torch.bfloat16) for n in (5, 1, 1)]
    batch = StageOutputBatch(
        chunks=[
            StageOutputChunk(
                request_id=f"q{i}",
                stage_id=0,
                token_ids=[i],
                additional_information={"hidden_start": i, "hidden_states": r},
            )
            for i, r in enumerate(rows)
        ]
    )
    out = decode(encode(batch))
    assert [c.request_id for c in out.chunks] == ["q0", "q1", "q2"]
    for chunk, r in zip(out.chunks, rows, strict=True):
        assert same_bits(chunk.additional_information["hidden_states"], r)
    batch.chunks[1].additional_information["hidden_states"] = torch.zeros([1] * 9)
    with pytest.raises(PayloadError, match=r"chunks\[1\]\.additional_information\['hidden_states'\].*max_ndim"):
        encode(batch)


def hidden_rows(start: int, n: int, layers: tuple[int, ...] = (1,)) -> HiddenRows:
    return HiddenRows(start=start, last=torch.randn(n, 8), layers=[LayerRows(k, torch.randn(n, 8)) for k in layers])


def test_packed_batch_restores_each_chunks_rows_and_rejects_bad_ranges() -> None:
    positions = MRopePositions(torch.arange(15).reshape(3, 5), -2)
    chunks = [
        StageOutputChunk(request_id=f"q{i}", stage_id=3, token_ids=[i] * (i + 1), hidden=hidden_rows(i, n))
        for i, n in enumerate([5, 1, 0, 2])
    ] + [
        StageOutputChunk(request_id="plain", stage_id=3, token_ids=[9]),
        StageOutputChunk(request_id="end", stage_id=3, token_ids=[], finished=True, finish_reason="stop"),
    ]
    chunks[0].hidden.mrope = positions
    want = {c.request_id: (c.hidden.start, c.hidden.last.clone(), c.hidden.layers[0].rows.clone()) for c in chunks[:4]}
    tokens = {c.request_id: list(c.token_ids) for c in chunks}
    batch = StageOutputBatch.pack(chunks)
    # Tokens-and-rows chunks travel as columns; the first chunk (M-RoPE positions), the one
    # with no rows and the last one (an end) stay chunks.
    assert batch.columns is not None and batch.columns.request_ids == ["q1", "q3", "plain"]
    assert [c.request_id for c in batch.chunks] == ["q0", "q2", "end"] and batch.chunks_at == [0, 2, 5]
    frames = encode(batch)
    assert len(frames) == 1 + 2 + 1  # one buffer per layer for the whole step, plus the positions
    got = decode(frames).unpacked()
    assert [c.request_id for c in got] == list(tokens)  # the step's order, columns or not
    out = {c.request_id: c for c in got}
    for rid, chunk in out.items():
        assert chunk.stage_id == 3 and chunk.token_ids == tokens[rid]
    for rid, (start, last, layer1) in want.items():
        h = out[rid].hidden
        assert h.packed is None and h.start == start
        assert same_bits(h.last, last)
        assert [lr.layer for lr in h.layers] == [1] and same_bits(h.layers[0].rows, layer1)
    assert same_bits(out["q0"].hidden.mrope.positions, positions.positions) and out["q0"].hidden.mrope.delta == -2
    assert out["plain"].hidden is None and out["end"].finished and out["end"].finish_reason == "stop"

    def fresh() -> StageOutputBatch:
        two = [
            StageOutputChunk(request_id="q", stage_id=0, token_ids=[1], hidden=hidden_rows(0, 2)),
            StageOutputChunk(request_id="m", stage_id=0, hidden=hidden_rows(0, 1)),
        ]
        two[1].hidden.mrope = MRopePositions(torch.zeros(3, 0, dtype=torch.int64), 0)
        return decode(encode(StageOutputBatch.pack(two)))

    bad = fresh()
    bad.chunks[0].hidden.packed = RowRange(1, 5)
    with pytest.raises(
        PayloadError, match=r"chunks\[0\]\.hidden\.packed: \[1, 5\) is not a row range \(3 packed rows\)"
    ):
        bad.unpacked()
    bad = fresh()
    bad.columns.row_counts = [4]
    with pytest.raises(PayloadError, match=r"columns\.row_counts: sum to 4, 3 packed rows sent"):
        bad.unpacked()
    bad = fresh()
    bad.columns.token_counts = [2]
    with pytest.raises(PayloadError, match=r"columns\.token_counts: sum to 2, 1 token ids sent"):
        bad.unpacked()
    bad = fresh()
    bad.packed.layers[0].rows = bad.packed.layers[0].rows[:2]
    with pytest.raises(PayloadError, match=r"packed\.layers \(layer 1\): 2 rows, the last layer has 3"):
        bad.unpacked()
    bad = fresh()
    bad.chunks_at = [1, 1]
    with pytest.raises(PayloadError, match=r"chunks_at: 2 positions for 1 chunks, not increasing within 0\.\.1"):
        bad.unpacked()
    bad = fresh()
    bad.chunks_at = [2]
    with pytest.raises(PayloadError, match=r"chunks_at: 1 positions for 1 chunks"):
        bad.unpacked()
    bad = fresh()
    bad.columns.row_starts = [0, 0]
    with pytest.raises(PayloadError, match=r"columns\.row_starts: 2 entries for 1 requests"):
        bad.unpacked()
    # A column's request id is checked while the body decodes, like a chunk's.
    batch = StageOutputBatch.pack([StageOutputChunk(request_id="q", stage_id=0, token_ids=[1])])
    batch.columns.request_ids = ["bad id"]
    with pytest.raises(PayloadError, match=r"regex .* at `\$\.columns\.request_ids\[0\]`"):
        decode(encode(batch))


def test_a_step_packs_twice_with_rows_for_some_requests_only() -> None:
    """A final stage packs one step twice: all rows for the stages downstream, and for the
    coordinator the rows of the requests that asked (`rows_for`). Packing leaves the chunks
    as they were, so the second pack sees what the first did."""
    chunks = [
        StageOutputChunk(request_id=f"q{i}", stage_id=0, token_ids=[i], hidden=hidden_rows(10 * i, 2)) for i in range(3)
    ]
    chunks[0].hidden.mrope = MRopePositions(torch.zeros(3, 2, dtype=torch.int64), 0)  # q0 stays a chunk
    rows = {c.request_id: c.hidden.last.clone() for c in chunks}
    for_client = decode(encode(StageOutputBatch.pack(chunks, rows_for={"q1"}))).unpacked()
    downstream = decode(encode(StageOutputBatch.pack(chunks))).unpacked()
    assert [c.request_id for c in for_client] == [c.request_id for c in downstream] == ["q0", "q1", "q2"]
    assert [c.hidden is not None for c in for_client] == [False, True, False]
    assert [c.token_ids for c in for_client] == [[0], [1], [2]]
    assert same_bits(for_client[1].hidden.last, rows["q1"]) and for_client[1].hidden.start == 10
    for got in downstream:
        assert same_bits(got.hidden.last, rows[got.request_id])
    assert downstream[0].hidden.mrope is not None
    assert all(c.hidden is not None and c.hidden.packed is None and c.hidden.last is not None for c in chunks)


def test_hidden_rows_shapes_are_checked_before_any_tensor_exists() -> None:
    chunk = StageOutputChunk(request_id="q", stage_id=0, hidden=HiddenRows(start=0, last=torch.zeros(4)))
    with pytest.raises(PayloadError, match=r"StageOutputChunk\.hidden\.last: must be 2-D"):
        encode(chunk)
    bad_pos = MRopePositions(torch.zeros(2, 4, dtype=torch.int64), 0)
    chunk = StageOutputChunk(
        request_id="q", stage_id=0, hidden=HiddenRows(start=0, last=torch.zeros(4, 2), mrope=bad_pos)
    )
    with pytest.raises(
        PayloadError, match=r"hidden\.mrope\.positions: M-RoPE positions must be int64 \[3, prompt_len\]"
    ):
        encode(chunk)


def test_every_message_type_round_trips() -> None:
    info = {"hidden": torch.randn(3, 8), "ids": [1, -2, 3], "n": 7, "scale": 0.5, "flag": True, "speaker": "Chelsie"}
    msgs = [
        StageRequest(
            request_id="a.b:c-1_2",
            stage_id=1,
            prompt_token_ids=[1, 2, 3],
            prompt_embeds=PromptEmbeds(torch.randn(2, 4, dtype=torch.bfloat16)),
            additional_information=info,
            sampling_params=SamplingParamsMsg(max_tokens=4, temperature=0.7, top_k=5, seed=3, stop_token_ids=[2]),
            deadline_s=17.5,
        ),
        StageOutputChunk(request_id="r", stage_id=0, token_ids=[5], finished=True, finish_reason="stop"),
        StageOutputBatch(chunks=[StageOutputChunk(request_id="r", stage_id=0, token_ids=[5])]),
        ErrorEvent(request_id="r", stage_id=0, code="bad_input", message="x" * 1000),
        Abort(request_id="r", reason="client gone"),
        Ready(stage_id=3, pid=1234, info={"model": "tiny"}),
        Heartbeat(stage_id=3, seq=9, time=12.5),
        Shutdown(reason="bye"),
        Finished(  # lists of Structs are walked item by item
            request_id="r",
            outputs=[StageResult(stage_id=2, token_ids=[1, 2], text="hi")],
            stage_timings=[],
            t_submit=1.0,
            t_finished=2.0,
        ),
    ]
    assert {type(m) for m in msgs} <= set(MESSAGE_TYPES)
    tags = [t.__struct_config__.tag for t in MESSAGE_TYPES]
    assert len(set(tags)) == len(tags) and all(issubclass(t, MessageBase) for t in MESSAGE_TYPES)
    for msg in msgs:
        out = decode(encode(msg))
        assert type(out) is type(msg)
        for name in msg.__struct_fields__:
            a, b = getattr(msg, name), getattr(out, name)
            if isinstance(a, PromptEmbeds):
                assert same_bits(a.data, b.data)
            elif isinstance(a, dict):
                assert a.keys() == b.keys()
                assert all(same_bits(v, b[k]) if isinstance(v, torch.Tensor) else v == b[k] for k, v in a.items())
            else:
                assert a == b, name


def test_list_items_are_checked_with_their_path() -> None:
    body = {"t": "Finished", "request_id": "r", "outputs": [{"stage_id": 1, "text": "x" * 30}],
            "stage_timings": [], "t_submit": 0.0, "t_finished": 0.0}  # fmt: skip
    check_rejected(
        raw_frames(body), "Finished.outputs[0].text: string of 30 chars", limits=Limits(max_string_length=20)
    )


def test_decoded_tensors_are_views_of_the_frames() -> None:
    t = torch.arange(1 << 16, dtype=torch.float32)
    frames = encode(StageOutputChunk(request_id="r", stage_id=0, additional_information={"t": t}))
    buf = bytearray(frames[1])
    out = decode([frames[0], buf]).additional_information["t"]
    buf[0:4] = b"\0\0\x80\x3f"  # 1.0
    assert out[0].item() == 1.0


def check_rejected(frames: list, *needles: str, limits: Limits = DEFAULT_LIMITS) -> PayloadError:
    with pytest.raises(PayloadError) as info:
        decode(frames, limits)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    return info.value


def test_missing_extra_and_shared_frames_are_rejected() -> None:
    t = torch.ones(4, dtype=torch.float32).numpy().tobytes()
    good = raw_frames(request_body(additional_information={"a": ref("float32", [4], 16)}), t)
    assert decode(good).additional_information["a"].tolist() == [1.0] * 4
    check_rejected(good[:1], "additional_information['a']", "frame index 1")
    check_rejected(good + [b"x"], "frames [2] not referenced")
    check_rejected([good[0], t[:8]], "frame 1 holds 8 bytes, header says 16")
    shared = request_body(additional_information={"a": ref("float32", [4], 16), "b": ref("float32", [4], 16)})
    check_rejected(raw_frames(shared, t, t), "['b']", "frame 1 is already used")
    check_rejected(
        raw_frames(request_body(additional_information={"a": ref("float32", [4], 16, 0)}), t), "frame index 0"
    )
    check_rejected([], "no frames")


def test_lying_headers_are_rejected() -> None:
    t = bytes(16)
    cases = {
        "nbytes 12 != 16": ref("float32", [4], 12),
        "nbytes 16 != 32": ref("float32", [2, 4], 16),
        "negative dimension -4": ref("float32", [-4, -1], 16),
        "dtype 'complex64' not in allowed_dtypes": ref("complex64", [2], 16),
        "ndim 9 > max_ndim=8": ref("uint8", [1] * 9, 1),
    }
    for needle, header in cases.items():
        check_rejected(raw_frames(request_body(additional_information={"h": header}), t), "['h']", needle)
    embeds = request_body(prompt_embeds={"data": ref("float32", [4], 16)})
    check_rejected(raw_frames(embeds, t), "StageRequest.prompt_embeds.data", "must be 2-D")


def test_bool_tensor_bytes_must_be_zero_or_one() -> None:
    body = request_body(additional_information={"m": ref("bool", [3], 3)})
    assert decode(raw_frames(body, b"\x00\x01\x00")).additional_information["m"].tolist() == [False, True, False]
    check_rejected(raw_frames(body, b"\x00\x02\x00"), "['m']", "bool")


def test_wrong_types_unknown_tags_and_fields_are_rejected() -> None:
    check_rejected(raw_frames(request_body(stage_id="zero")), "Expected `int`", "$.stage_id")
    check_rejected(raw_frames(request_body(stage_id=-1)), "$.stage_id")
    check_rejected(raw_frames(request_body(prompt_token_ids=[1, "2"])), "$.prompt_token_ids[1]")
    check_rejected(raw_frames({"t": "Evil", "request_id": "r"}), "Invalid value 'Evil'")
    check_rejected(raw_frames(request_body(pickle=b"cos\nsystem\n")), "unknown field `pickle`")
    check_rejected(raw_frames(request_body(additional_information={"x": {"nested": 1}})), "additional_information")
    check_rejected(raw_frames(request_body(additional_information={"h": {**ref("uint8", [1], 1), "evil": 1}})), "evil")
    check_rejected(raw_frames(request_body(sampling_params={"top_p": 2.0})), "$.sampling_params.top_p")
    check_rejected([b"\xc1garbage"], "body")
    check_rejected([b"\x92\x01"], "body")  # truncated array


def test_limits_name_the_field_the_value_and_the_limit() -> None:
    limits = Limits(max_info_entries=4, max_list_length=10, max_string_length=20, max_name_length=8)
    huge_map = {f"k{i}": i for i in range(5)}
    check_rejected(
        raw_frames(request_body(additional_information=huge_map)),
        "StageRequest.additional_information: 5 entries > max_info_entries=4",
        limits=limits,
    )
    check_rejected(
        raw_frames(request_body(prompt_token_ids=list(range(11)))), "11 items > max_list_length=10", limits=limits
    )
    check_rejected(
        raw_frames({"t": "Abort", "request_id": "r", "reason": "x" * 21}),
        "Abort.reason: string of 21 chars > max_string_length=20",
        limits=limits,
    )
    check_rejected(
        raw_frames(request_body(additional_information={"much_too_long": 1})), "'much_too_long'", "1..8", limits=limits
    )
    check_rejected(raw_frames(request_body(request_id="r/../x")), "request_id: 'r/../x'")
    check_rejected(raw_frames(request_body(request_id="r" * 129)), "request_id")
    check_rejected(raw_frames(request_body(request_id="")), "request_id")


def test_size_limits_apply_before_decoding() -> None:
    limits = Limits(max_body_bytes=64, max_message_bytes=1000, max_tensor_bytes=100)
    check_rejected(raw_frames(request_body(prompt_token_ids=list(range(100)))), "max_body_bytes=64", limits=limits)
    check_rejected([b"\x80", bytes(1001)], "1002 bytes > max_message_bytes=1000", limits=limits)
    body = request_body(additional_information={"h": ref("uint8", [200], 200)})
    check_rejected(
        raw_frames(body, bytes(200)), "['h']: 200 bytes > max_tensor_bytes=100", limits=Limits(max_tensor_bytes=100)
    )


def test_error_carries_the_request_id_when_it_can_be_recovered() -> None:
    err = check_rejected(
        raw_frames(request_body(request_id="req-7", additional_information={"h": ref("uint8", [2], 1)}), b"x")
    )
    assert err.request_id == "req-7"
    err = check_rejected(raw_frames(request_body(request_id="req-8", stage_id="x")))
    assert err.request_id == "req-8"
    assert check_rejected(raw_frames(request_body(request_id="bad id!", stage_id="x"))).request_id is None
    assert check_rejected([b"\xc1"]).request_id is None


def test_encode_validates_on_the_sender() -> None:
    def rejected(msg: object, needle: str, limits: Limits = DEFAULT_LIMITS) -> None:
        with pytest.raises(PayloadError, match=needle):
            encode(msg, limits)

    chunk = StageOutputChunk
    rejected(chunk(request_id="r", stage_id=0, additional_information={"x": torch.zeros(2, device="meta")}), "only CPU")
    rejected(
        chunk(request_id="r", stage_id=0, additional_information={"x": torch.zeros(2, dtype=torch.float64)}), "float64"
    )
    rejected(chunk(request_id="r", stage_id=0, additional_information={"x": torch.zeros(2).to_sparse()}), "layout")
    rejected(chunk(request_id="r", stage_id=0, prompt_embeds=PromptEmbeds(torch.zeros(2))), "must be 2-D")
    rejected(chunk(request_id="r", stage_id=0, additional_information={"x": [torch.zeros(1)]}), "tensors may only be")
    rejected(chunk(request_id="r", stage_id=0, additional_information={"x": object()}), "object cannot be sent")
    rejected(chunk(request_id="no spaces", stage_id=0), "request_id")
    rejected(chunk(request_id="r", stage_id=0, token_ids=list(range(1 << 21))), "max_list_length")
    rejected(
        chunk(request_id="r", stage_id=0, additional_information={"x": torch.zeros(100)}),
        "max_message_bytes=300",
        Limits(max_message_bytes=300),
    )
    validate(chunk(request_id="r", stage_id=0, additional_information={"x": torch.zeros(2)}))


def test_limits_load_strictly_from_config() -> None:
    limits = msgspec.convert({"max_ndim": 4, "allowed_dtypes": ["float32", "bfloat16"]}, Limits)
    assert limits.allowed_dtypes == ("float32", "bfloat16") and limits.max_ndim == 4
    with pytest.raises(msgspec.ValidationError, match="max_ndims"):
        msgspec.convert({"max_ndims": 4}, Limits)
    with pytest.raises(msgspec.ValidationError, match="float64"):
        msgspec.convert({"allowed_dtypes": ["float64"]}, Limits)
    with pytest.raises(msgspec.ValidationError, match="max_tensor_bytes must be > 0"):
        msgspec.convert({"max_tensor_bytes": 0}, Limits)
    body = request_body(additional_information={"h": ref("uint8", [1], 1)})
    check_rejected(raw_frames(body, b"x"), "not in allowed_dtypes", limits=limits)


def test_huge_tensor_header_allocates_nothing() -> None:
    """A header declaring 10**12 float32 elements must fail on arithmetic alone: measured as
    the peak RSS of a fresh process, which a real allocation of 4 TB (or even a page-touching
    attempt) would blow up."""
    script = textwrap.dedent(
        """
        import resource, msgspec
        from omni_mp.wire.codec import Limits, PayloadError, decode
        huge = {"dtype": "float32", "shape": [10**6, 10**6], "nbytes": 4 * 10**12, "loc": 1}
        body = msgspec.msgpack.encode({"t": "StageRequest", "request_id": "r", "stage_id": 0,
                                       "additional_information": {"h": huge}})
        loose = Limits(max_tensor_elements=10**13, max_tensor_bytes=10**13, max_message_bytes=10**13)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for limits in (Limits(), loose):
            for _ in range(100):
                try:
                    decode([body, b"\\0" * 4], limits)
                except PayloadError as e:
                    msg = str(e)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, msg)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    grown_kib, message = out.stdout.split(" ", 1)
    assert "frame 1 holds 4 bytes, header says 4000000000000" in message
    assert int(grown_kib) < 20 * 1024, out.stdout


def test_tensor_ref_is_the_wire_form_of_tensors() -> None:
    """The decoder's view of tensor fields is TensorRef; a decoded message never exposes one."""
    msg = decode(encode(StageRequest(request_id="r", stage_id=0, prompt_embeds=PromptEmbeds(torch.ones(1, 2)))))
    assert isinstance(msg.prompt_embeds.data, torch.Tensor) and not isinstance(msg.prompt_embeds.data, TensorRef)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"t": "Submit", "request_id": "r", "prompt": "x", "sampling": [{"stage_id": 0, "params": {}}] * 100_000}, "sampling"),  # noqa: E501
        ({"t": "StageOutputBatch", "chunks": [{"t": "StageOutputChunk", "request_id": "r", "stage_id": 0}] * 100_000}, "chunks"),  # noqa: E501
        ({"t": "Submit", "request_id": "r", "prompt": "x", "sampling": [{"stage_id": 0, "params": {"stop_token_ids": [1] * 100_000}}]}, "stop_token_ids"),  # noqa: E501
        ({"t": "StatusReply", "pipeline": "p", "inflight": 0, "stages": [{"stage_id": 0, "pid": 1, "alive": True, "ready": True, "restarts": 0}] * 100_000}, "stages"),  # noqa: E501
        ({"t": "Ready", "stage_id": 0, "pid": 1, "info": {f"k{i}": "v" for i in range(100_000)}}, "info"),
    ],
)  # fmt: skip
def test_oversized_lists_are_refused_while_decoding(body: dict, field: str) -> None:
    """Bounds live in the message types (Meta(max_length)): msgspec stops at the length
    prefix, before building 100k items (a 100k-entry `sampling` list took 0.6 s to refuse)."""
    frame = msgspec.msgpack.encode(body)
    t0 = time.perf_counter()
    with pytest.raises(PayloadError, match=field):
        decode([frame])
    assert time.perf_counter() - t0 < 0.05

"""Messages between processes and their codec: msgspec Structs in one tagged union, tensors
as small headers plus raw buffers, and validation against Limits before any tensor exists.

Wire format of one message (a ZMQ multipart message):
  frame 0     msgpack body: the Struct, tag field "t"; each tensor is a TensorRef header
              {dtype, shape, nbytes, loc}
  frame 1..n  raw tensor bytes, one frame per tensor whose loc is its frame index; a tensor
              whose loc is a ShmRef sits in the sender's shared-memory pool instead.

Decoded tensors are views of the received buffers (no copy): treat them as read-only, and
clone() what you keep beyond the message when it came through shared memory (a held view
holds pool space, see shm_pool).

Adding a message type: subclass MessageBase and add the class to `Message` below.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, get_args

import msgspec
import torch
from msgspec import Meta

from omni_mp.wire.shm_pool import ShmReader, ShmRef, ShmRegion
from omni_mp.wire.tensor_codec import (
    DEFAULT_LIMITS,
    MAX_INFO_ENTRIES,
    MAX_LIST_LENGTH,
    MAX_NDIM,
    SUPPORTED_DTYPES,
    Limits,
    PayloadError,
    check_header,
    shown,
    tensor_bytes,
    tensor_from_buffer,
    tensor_header,
)

__all__ = [
    "MAX_STAGES",
    "DEFAULT_LIMITS",
    "MESSAGE_TYPES",
    "SUPPORTED_DTYPES",
    "Abort",
    "AdditionalInformation",
    "AudioInput",
    "Buffer",
    "BufferPlacer",
    "Connect",
    "ErrorEvent",
    "Finished",
    "HiddenRows",
    "Heartbeat",
    "ImageInput",
    "InfoValue",
    "LayerRows",
    "MRopePositions",
    "PackedRows",
    "RowRange",
    "Limits",
    "Message",
    "MessageBase",
    "MultiModalInput",
    "PayloadError",
    "PromptEmbeds",
    "Ready",
    "SamplingParamsMsg",
    "Shutdown",
    "StageDone",
    "StageEndpoint",
    "StageOutputBatch",
    "StageOutputChunk",
    "StageRequest",
    "StageResult",
    "StageSampling",
    "StageStatus",
    "StatusReply",
    "StatusRequest",
    "Submit",
    "TensorRef",
    "decode",
    "decode_with_regions",
    "encode",
    "validate",
]


# A step's batch: at most vLLM's max_num_seqs requests (1024 is already a very large batch).
MAX_BATCH = 8192
# Stages of one pipeline (config.PipelineConfig checks it too): bounds every per-stage list.
MAX_STAGES = 64


class TensorRef(msgspec.Struct, forbid_unknown_fields=True):
    """Wire header of one tensor. `loc` is the index of the frame holding its bytes, or the
    shared-memory region holding them."""

    dtype: Annotated[str, Meta(max_length=16)]
    shape: Annotated[list[int], Meta(max_length=MAX_NDIM)]
    nbytes: int
    loc: int | ShmRef


if TYPE_CHECKING:
    Tensor = torch.Tensor
else:
    # msgspec reads annotations to decode, and on the wire a tensor *is* its TensorRef
    # header: decode() swaps each header for the real tensor once everything is validated.
    # Encoding ignores annotations (enc_hook turns tensors into headers).
    Tensor = TensorRef

TokenId = Annotated[int, Meta(ge=0)]
StageId = Annotated[int, Meta(ge=0, le=2**31)]
# Every list and map is bounded in its type, so an oversized one is refused while msgspec
# decodes it, before any of its items exist (a Submit with 100k `sampling` entries took
# 0.6 s to decode and refuse; now it fails at the length prefix). Limits (YAML) may lower
# the bounds of token lists, strings and maps further; they are checked after decoding.
TokenIds = Annotated[list[TokenId], Meta(max_length=MAX_LIST_LENGTH)]
PerStage = Meta(max_length=MAX_STAGES)
InfoValue = Tensor | Annotated[list[int], Meta(max_length=MAX_LIST_LENGTH)] | int | float | bool | str
# Named tensors and scalars for the next stage (e.g. per-step hidden states, speaker).
AdditionalInformation = Annotated[dict[str, InfoValue], Meta(max_length=MAX_INFO_ENTRIES)]
StrMap = Annotated[dict[str, str], Meta(max_length=MAX_INFO_ENTRIES)]

SpeakerName = Annotated[str, Meta(min_length=1, max_length=64)]

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]+")


class PromptEmbeds(msgspec.Struct, forbid_unknown_fields=True):
    """Embeddings to use as (part of) the next stage's prompt: [num_tokens, hidden]."""

    data: Tensor


class LayerRows(msgspec.Struct, forbid_unknown_fields=True):
    """Rows of one intermediate layer (Hugging Face numbering: 0 = embeddings)."""

    layer: Annotated[int, Meta(ge=0, le=4096)]
    rows: Tensor  # [n, hidden]


class MRopePositions(msgspec.Struct, forbid_unknown_fields=True):
    """M-RoPE models: a prompt's positions and the offset of every later position (row i >= L
    is at i + delta on every axis; text after images runs ahead of or behind its index)."""

    positions: Tensor  # int64 [3, L]
    delta: int


class RowRange(msgspec.Struct, forbid_unknown_fields=True, array_like=True):
    start: Annotated[int, Meta(ge=0)]
    stop: Annotated[int, Meta(ge=0)]


class HiddenRows(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Hidden states of consecutive positions [start, start + n) of one request: the one
    type of a hidden-row stream from the engine that computed them, over the wire, to the
    stage that consumes them (omni_mp.engines.rows.RowStream accumulates them there).

    `last` is the last layer after the final norm. Inside a StageOutputBatch the rows travel
    in the batch's `packed` tensors and `packed` names this request's range of them."""

    start: Annotated[int, Meta(ge=0)]
    last: Tensor | None = None  # [n, hidden]
    layers: Annotated[list[LayerRows], Meta(max_length=64)] = []
    mrope: MRopePositions | None = None  # with a request's first rows
    packed: RowRange | None = None


class PackedRows(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The hidden rows of every chunk of one step batch, concatenated: one header and one
    buffer per layer and step instead of one per request."""

    last: Tensor
    layers: Annotated[list[LayerRows], Meta(max_length=64)] = []


class AudioInput(msgspec.Struct, forbid_unknown_fields=True):
    """A mono waveform: float32 [samples] in [-1, 1] at `sample_rate` (the stage resamples)."""

    samples: Tensor
    sample_rate: Annotated[int, Meta(ge=1000, le=384_000)]


class ImageInput(msgspec.Struct, forbid_unknown_fields=True):
    """An RGB image: uint8 [height, width, 3]."""

    pixels: Tensor


class MultiModalInput(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Media for an entry stage whose model takes them (e.g. Qwen2.5-Omni's thinker), in the
    order the prompt mentions them. Shapes and sizes are checked by the stage against its
    model (MediaLimits) before anything is processed."""

    audios: Annotated[list[AudioInput], Meta(max_length=16)] = []
    images: Annotated[list[ImageInput], Meta(max_length=16)] = []


class SamplingParamsMsg(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    max_tokens: Annotated[int, Meta(ge=0)] = 16
    min_tokens: Annotated[int, Meta(ge=0)] = 0
    temperature: Annotated[float, Meta(ge=0.0)] = 0.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=0)] = 0  # 0 = disabled
    seed: int | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] = 1.0
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=1024)] = []
    ignore_eos: bool = False
    # Ids never sampled (transformers' suppress_tokens), e.g. a talker's codec_bos.
    suppress_token_ids: Annotated[list[TokenId], Meta(max_length=1024)] = []


class MessageBase(
    msgspec.Struct, tag_field="t", tag=True, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, weakref=True
):
    """Base of every wire message; the tag is the class name. (weakref: a receiver tracks
    which shared-memory regions a message holds without keeping the message alive.)"""


class StageRequest(MessageBase):
    """Coordinator -> stage: register a request (every stage of the pipeline gets one); an
    entry stage also gets the prompt, as text (tokenized by the stage) or token ids."""

    request_id: str
    stage_id: StageId
    prompt: str | None = None
    prompt_token_ids: TokenIds | None = None
    prompt_embeds: PromptEmbeds | None = None
    multi_modal: MultiModalInput | None = None  # entry stages only
    speaker: SpeakerName | None = None  # stages that speak use it; None: their default
    additional_information: AdditionalInformation | None = None
    sampling_params: SamplingParamsMsg | None = None
    deadline: float | None = None  # unix time, seconds


class StageOutputChunk(MessageBase):
    """One engine step's output for one request."""

    request_id: str
    stage_id: StageId
    token_ids: TokenIds = []  # new tokens of this step
    prompt_token_ids: TokenIds | None = None  # the stage's prompt, on its first chunk
    prompt_embeds: PromptEmbeds | None = None
    hidden: HiddenRows | None = None  # stages that emit hidden states
    additional_information: AdditionalInformation | None = None
    finished: bool = False
    finish_reason: str | None = None
    text: str | None = None  # the decoded output, on the last chunk of a final stage


class StageOutputBatch(MessageBase):
    """The chunks of one engine step, for every request that produced output: one message per
    step and destination, whatever the batch size (per-message costs do not grow with it).

    `packed` holds the chunks' hidden rows concatenated (see PackedRows); `pack()` builds it,
    `unpacked()` gives each chunk its rows back as views."""

    chunks: Annotated[list[StageOutputChunk], Meta(max_length=MAX_BATCH)]
    packed: PackedRows | None = None

    @classmethod
    def pack(cls, chunks: list[StageOutputChunk]) -> StageOutputBatch:
        """Move the chunks' hidden rows into `packed` (every chunk's rows have the same layers)."""
        last: list[torch.Tensor] = []
        layers: dict[int, list[torch.Tensor]] = {}
        row = 0
        for chunk in chunks:
            h = chunk.hidden
            if h is None or h.last is None:
                continue
            n = h.last.shape[0]
            last.append(h.last)
            for lr in h.layers:
                layers.setdefault(lr.layer, []).append(lr.rows)
            chunk.hidden = msgspec.structs.replace(h, last=None, layers=[], packed=RowRange(row, row + n))
            row += n
        if not last:
            return cls(chunks=chunks)
        return cls(
            chunks=chunks,
            packed=PackedRows(last=_cat(last), layers=[LayerRows(k, _cat(v)) for k, v in layers.items()]),
        )

    def unpacked(self) -> list[StageOutputChunk]:
        """The chunks with their packed rows restored as views; PayloadError on bad row ranges."""
        packed = self.packed
        for i, chunk in enumerate(self.chunks):
            h = chunk.hidden
            if h is None or h.packed is None:
                continue
            r = h.packed
            if packed is None or not r.start <= r.stop <= packed.last.shape[0]:
                size = "no packed rows" if packed is None else f"{packed.last.shape[0]} packed rows"
                raise PayloadError(
                    f"StageOutputBatch.chunks[{i}].hidden.packed: [{r.start}, {r.stop}) is not a row range ({size})"
                )
            chunk.hidden = msgspec.structs.replace(
                h,
                last=packed.last[r.start : r.stop],
                layers=[LayerRows(lr.layer, lr.rows[r.start : r.stop]) for lr in packed.layers],
                packed=None,
            )
        return self.chunks


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class ErrorEvent(MessageBase):
    """A request ended with an error. `stage_id` None: raised by the coordinator itself;
    `request_id` None: the offending message could not be tied to a request."""

    request_id: str | None
    stage_id: StageId | None
    code: str
    message: str


class Abort(MessageBase):
    request_id: str
    reason: str


class Ready(MessageBase):
    """Stage -> coordinator: the engine is up; `info["input"]` is the address it bound."""

    stage_id: StageId
    pid: int
    info: StrMap = {}


class Heartbeat(MessageBase):
    stage_id: StageId
    seq: int
    time: float


class Shutdown(MessageBase):
    reason: str = ""


class StageEndpoint(msgspec.Struct, forbid_unknown_fields=True):
    stage_id: StageId
    endpoint: str


class Connect(MessageBase):
    """Coordinator -> stage: send your outputs to these downstream stage inputs (again after
    a downstream stage restarted, possibly at a new address)."""

    downstream: Annotated[list[StageEndpoint], PerStage]


class Connected(MessageBase):
    """Stage -> coordinator: the links to these downstream stage inputs are open (after Connect)."""

    stage_id: StageId
    downstream: Annotated[list[StageEndpoint], PerStage]


class StageDone(MessageBase):
    """Stage -> coordinator: a request finished in this stage; counts and unix timestamps."""

    request_id: str
    stage_id: StageId
    num_prompt_tokens: int
    num_output_tokens: int
    t_registered: float
    t_started: float
    t_first_token: float | None
    t_finished: float
    finish_reason: str | None = None


class StageSampling(msgspec.Struct, forbid_unknown_fields=True):
    stage_id: StageId
    params: SamplingParamsMsg


class Submit(MessageBase):
    """Client -> coordinator: run a request through the pipeline. Exactly one of `prompt`,
    `prompt_token_ids` and `prompt_embeds`; `sampling` overrides stage defaults;
    `deadline_s` is relative."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: TokenIds | None = None
    prompt_embeds: PromptEmbeds | None = None  # for entry stages with `prompt_embeds: true`
    multi_modal: MultiModalInput | None = None  # audio/images for an entry stage that takes them
    speaker: SpeakerName | None = None  # the voice of stages that speak (unknown: an error)
    sampling: Annotated[list[StageSampling], PerStage] = []
    deadline_s: Annotated[float, Meta(gt=0.0, le=1e7)] | None = None  # NaN and inf refused while decoding
    stream: bool = False
    # The final stages to answer (empty: all of them). Only they and the stages upstream of
    # them run the request, e.g. [0] for the text answer of thinker -> talker -> token2wav.
    final_stages: Annotated[list[StageId], PerStage] = []


class StageResult(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What a final stage produced for a request."""

    stage_id: StageId
    token_ids: TokenIds = []
    text: str | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    audio: Tensor | None = None  # float32 [samples] of an audio-producing stage (omni_mp.audio)
    sample_rate: int | None = None


class Finished(MessageBase):
    """Coordinator -> client: the request's terminal success event."""

    request_id: str
    outputs: Annotated[list[StageResult], PerStage]
    stage_timings: Annotated[list[StageDone], PerStage]
    t_submit: float
    t_finished: float


class StatusRequest(MessageBase):
    """Client -> coordinator; the reply carries the same `request_id` (the client's tag)."""

    request_id: str | None = None


class StageStatus(msgspec.Struct, forbid_unknown_fields=True):
    stage_id: StageId
    pid: int
    alive: bool
    ready: bool  # serving: engine up and links to its downstream stages open
    restarts: int
    info: StrMap = {}


class StatusReply(MessageBase):
    pipeline: str
    stages: Annotated[list[StageStatus], PerStage]
    inflight: int
    request_id: str | None = None  # the StatusRequest's


Message = (
    StageRequest | StageOutputChunk | StageOutputBatch | ErrorEvent | Abort | Ready | Heartbeat | Shutdown
    | Connect | Connected | StageDone | Submit | Finished | StatusRequest | StatusReply
)  # fmt: skip
MESSAGE_TYPES: tuple[type[MessageBase], ...] = get_args(Message)

# A buffer for ZMQ send_multipart (bytes, or an object exporting the buffer protocol).
Buffer = Any
# Decides where a tensor's bytes go: gets them as a flat uint8 tensor and returns the shared
# memory region it copied them into, or None to send them as a frame.
BufferPlacer = Callable[[torch.Tensor], ShmRef | None]

_DECODER = msgspec.msgpack.Decoder(Message)
# What msgspec raises on a bad body: ValidationError is a DecodeError; invalid UTF-8 in a
# string surfaces as UnicodeDecodeError (found by tests/test_payload_fuzz.py).
_BODY_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)


class _RequestIdOnly(msgspec.Struct):
    """Lenient view of a rejected body, to tell which request the error belongs to."""

    request_id: str | None = None


class _Slot:
    """Where a tensor (or, decoding, its header) sits in a message, so it can be replaced."""

    __slots__ = ("container", "dtype", "key", "nbytes", "path", "shape")

    def __init__(self, container: Any, key: str, path: str, header: tuple[str, list[int], int]) -> None:
        self.container, self.key, self.path = container, key, path
        self.dtype, self.shape, self.nbytes = header

    @property
    def value(self) -> Any:
        c = self.container
        return c[self.key] if isinstance(c, dict) else getattr(c, self.key)

    def put(self, value: Any) -> None:
        if isinstance(self.container, dict):
            self.container[self.key] = value
        else:
            setattr(self.container, self.key, value)


# Values with nothing to check; skipping them first keeps the walk cheap for small messages.
_SCALARS = frozenset({type(None), bool, int, float})
_WIRE_STRUCTS = (TensorRef, ShmRef)  # leaves, not containers to walk into


def _fields(obj: msgspec.Struct, prefix: str) -> Iterator[tuple[Any, str, Any, str]]:
    """(container, key, value, path) for every non-scalar value in a message: Struct fields
    (recursing into nested Structs and lists of Structs) and the entries of dict fields,
    after the dict itself."""
    for name in obj.__struct_fields__:
        value = getattr(obj, name)
        cls = type(value)
        if cls in _SCALARS:
            continue
        path = prefix + name
        if isinstance(value, msgspec.Struct) and not isinstance(value, _WIRE_STRUCTS):
            yield from _fields(value, path + ".")
            continue
        yield obj, name, value, path
        if cls is list and value and isinstance(value[0], msgspec.Struct):
            for i, item in enumerate(value):  # e.g. Finished.outputs: each item checked too
                yield from _fields(item, f"{path}[{i}].")
        elif cls is dict:
            for key, item in value.items():
                if type(item) not in _SCALARS:
                    yield value, key, item, f"{path}[{shown(key)}]"


def _check(msg: msgspec.Struct, limits: Limits, tensor_type: type, body_bytes: int = 0) -> list[_Slot]:
    """Check every value of `msg` against `limits` and return its tensor slots. `tensor_type`
    is torch.Tensor when sending, TensorRef when receiving."""
    slots: list[_Slot] = []
    total = 0
    for container, key, value, path in _fields(msg, type(msg).__name__ + "."):
        cls = type(value)
        if cls is str:
            if len(value) > limits.max_string_length:
                raise PayloadError(
                    f"{path}: string of {len(value)} chars > max_string_length={limits.max_string_length}"
                )
        elif cls is list:
            if len(value) > limits.max_list_length:
                raise PayloadError(f"{path}: list of {len(value)} items > max_list_length={limits.max_list_length}")
        elif cls is dict:
            if len(value) > limits.max_info_entries:
                raise PayloadError(f"{path}: {len(value)} entries > max_info_entries={limits.max_info_entries}")
            for name in value:
                if type(name) is not str or not 0 < len(name) <= limits.max_name_length:
                    raise PayloadError(f"{path}: key {shown(name)} is not a str of 1..{limits.max_name_length} chars")
        elif isinstance(value, tensor_type):
            if cls is TensorRef:
                header = (value.dtype, value.shape, value.nbytes)
            else:
                header = tensor_header(value, path)
            check_header(*header, limits, path)
            _check_shape(type(container), header, path)
            slots.append(_Slot(container, key, path, header))
            total += header[2]
        else:
            raise PayloadError(f"{path}: {cls.__name__} cannot be sent")
    request_id = getattr(msg, "request_id", None)
    if request_id is not None and not _valid_request_id(request_id, limits):
        raise PayloadError(
            f"{type(msg).__name__}.request_id: {shown(request_id)} is not 1..{limits.max_request_id_length} "
            f"chars of {_REQUEST_ID.pattern}"
        )
    _check_total(msg, body_bytes + total, limits)
    return slots


# Tensors whose shape the schema fixes: checked before any tensor exists.
_ROWS_2D = (PromptEmbeds, HiddenRows, LayerRows, PackedRows)


def _check_shape(container: type, header: tuple[str, list[int], int], path: str) -> None:
    dtype, shape, _ = header
    if container in _ROWS_2D and len(shape) != 2:
        raise PayloadError(f"{path}: must be 2-D [rows, hidden], got shape {shape}")
    if container is MRopePositions and (dtype != "int64" or len(shape) != 2 or shape[0] != 3):
        raise PayloadError(f"{path}: M-RoPE positions must be int64 [3, prompt_len], got {dtype} {shape}")


def _valid_request_id(request_id: Any, limits: Limits) -> bool:
    return (
        isinstance(request_id, str)
        and len(request_id) <= limits.max_request_id_length
        and _REQUEST_ID.fullmatch(request_id) is not None
    )


def _check_total(msg: msgspec.Struct, nbytes: int, limits: Limits) -> None:
    if nbytes > limits.max_message_bytes:
        raise PayloadError(
            f"{type(msg).__name__}: {nbytes} bytes in all > max_message_bytes={limits.max_message_bytes}"
        )


def validate(msg: Message, limits: Limits = DEFAULT_LIMITS) -> None:
    """Check an outgoing message against `limits` (encode does this too), so that a bad
    message fails loudly on the sender rather than being rejected by the receiver or
    dropped silently by ZMQ MAXMSGSIZE."""
    _check(msg, limits, torch.Tensor)


def encode(msg: Message, limits: Limits = DEFAULT_LIMITS, *, place: BufferPlacer | None = None) -> list[Buffer]:
    """Validate and encode `msg` into frames for send_multipart(copy=False).

    Tensor frames are views of the tensors' memory (a non-contiguous tensor is made
    contiguous first), so do not modify those tensors in place until ZMQ has sent them.
    `place` may divert tensor bytes into shared memory (see transport.MessageSender).
    """
    slots = _check(msg, limits, torch.Tensor)
    frames: list[Buffer] = [b""]
    headers = 0

    def to_header(obj: Any) -> TensorRef:
        nonlocal headers
        if not isinstance(obj, torch.Tensor):
            raise PayloadError(f"{type(msg).__name__}: {type(obj).__name__} cannot be sent")
        headers += 1
        data = tensor_bytes(obj)
        loc = place(data) if place is not None else None
        if loc is None:
            loc = len(frames)
            frames.append(data.numpy())  # the array keeps the tensor (and its memory) alive
        dtype, shape, nbytes = tensor_header(obj, "")
        return TensorRef(dtype, shape, nbytes, loc)

    frames[0] = msgspec.msgpack.encode(msg, enc_hook=to_header)
    if headers != len(slots):
        raise PayloadError(
            f"{type(msg).__name__}: tensors may only be Struct fields or dict values, "
            f"found {headers - len(slots)} elsewhere"
        )
    body_len = len(frames[0])
    if body_len > limits.max_body_bytes:
        raise PayloadError(f"{type(msg).__name__}: body of {body_len} bytes > max_body_bytes={limits.max_body_bytes}")
    _check_total(msg, body_len + sum(slot.nbytes for slot in slots), limits)
    return frames


def decode(frames: Sequence[Buffer], limits: Limits = DEFAULT_LIMITS, *, shm: ShmReader | None = None) -> Message:
    """Validate and decode one message (see decode_with_regions)."""
    return decode_with_regions(frames, limits, shm=shm)[0]


def decode_with_regions(
    frames: Sequence[Buffer], limits: Limits = DEFAULT_LIMITS, *, shm: ShmReader | None = None
) -> tuple[Message, list[ShmRegion]]:
    """Validate and decode one message; also return the shared-memory regions it holds.

    Order: sizes of all frames, then the typed body (unknown tags, fields and wrong types
    fail here), then every value against `limits` and every tensor header against its
    buffer (frames must each be used by exactly one tensor), and only then tensors are
    built, as views. Any failure raises PayloadError and returns the credits of the
    shared-memory regions the message named. `shm=None` rejects shared-memory tensors.
    """
    views = [_byte_view(f) for f in frames]
    if not views:
        raise PayloadError("message has no frames")
    body = views[0]
    if body.nbytes > limits.max_body_bytes:
        raise PayloadError(f"body: {body.nbytes} bytes > max_body_bytes={limits.max_body_bytes}")
    total = body.nbytes if len(views) == 1 else sum(v.nbytes for v in views)
    if total > limits.max_message_bytes:
        raise PayloadError(f"message: {total} bytes > max_message_bytes={limits.max_message_bytes}")
    try:
        msg = _DECODER.decode(body)
    except _BODY_ERRORS as exc:
        raise PayloadError(f"body: {exc}", request_id=_recover_request_id(body, limits)) from None
    regions: list[ShmRegion] = []
    try:
        slots = _check(msg, limits, TensorRef, body.nbytes)
        buffers = _claim_buffers(slots, views, shm, regions)
        for slot, buffer in zip(slots, buffers, strict=True):
            slot.put(tensor_from_buffer(slot.dtype, slot.shape, buffer, slot.path))
    except PayloadError as exc:
        _return_credits(msg, regions, shm)
        request_id = getattr(msg, "request_id", None)
        exc.request_id = request_id if _valid_request_id(request_id, limits) else None
        raise
    return msg, regions


def _byte_view(frame: Buffer) -> memoryview:
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _claim_buffers(
    slots: list[_Slot], views: list[memoryview], shm: ShmReader | None, regions: list[ShmRegion]
) -> list[memoryview]:
    """The buffer of each slot, after checking it against the header; frames must each be
    used exactly once. Shared-memory claims are appended to `regions` as they are made."""
    used = [False] * len(views)
    buffers = []
    for slot in slots:
        loc = slot.value.loc
        if isinstance(loc, ShmRef):
            if shm is None:
                raise PayloadError(f"{slot.path}: shared-memory tensor on a link that does not accept them")
            buffer, region = shm.view(loc, slot.nbytes, slot.path)
            regions.append(region)
        else:
            if not 1 <= loc < len(views):
                raise PayloadError(f"{slot.path}: frame index {loc} outside 1..{len(views) - 1}")
            if used[loc]:
                raise PayloadError(f"{slot.path}: frame {loc} is already used by another tensor")
            used[loc] = True
            buffer = views[loc]
            if buffer.nbytes != slot.nbytes:
                raise PayloadError(f"{slot.path}: frame {loc} holds {buffer.nbytes} bytes, header says {slot.nbytes}")
        buffers.append(buffer)
    unused = [i for i in range(1, len(views)) if not used[i]]
    if unused:
        raise PayloadError(f"message: frames {unused[:8]} not referenced by any tensor ({len(views) - 1} sent)")
    return buffers


def _return_credits(msg: msgspec.Struct, regions: list[ShmRegion], shm: ShmReader | None) -> None:
    """A rejected message must not keep pool space: release what was claimed, and discard
    the regions named but not yet claimed."""
    for region in regions:
        region.release()
    if shm is None:
        return
    claimed = {region.ref for region in regions}
    for _, _, value, _ in _fields(msg, ""):
        if isinstance(value, TensorRef) and isinstance(value.loc, ShmRef) and value.loc not in claimed:
            shm.discard(value.loc)


def _recover_request_id(body: memoryview, limits: Limits) -> str | None:
    try:
        request_id = msgspec.msgpack.decode(body, type=_RequestIdOnly).request_id
    except _BODY_ERRORS:
        return None
    return request_id if _valid_request_id(request_id, limits) else None

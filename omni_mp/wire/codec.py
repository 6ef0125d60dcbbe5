"""The codec of the messages in messages.py: validation against Limits before any tensor
exists, and tensors as small headers plus raw buffers.

Wire format of one message (a ZMQ multipart message):
  frame 0     msgpack body: the Struct, tag field "t"; each tensor is a TensorRef header
              {dtype, shape, nbytes, loc}
  frame 1..n  raw tensor bytes, one frame per tensor whose loc is its frame index; a tensor
              whose loc is a ShmRef sits in the sender's shared-memory pool instead.

Sent tensors may be torch tensors or numpy arrays. Decoded tensors are views of the received
buffers (no copy), built by the receiver's ArrayCodec: torch tensors by default (stages, the
coordinator), numpy arrays with `arrays=NUMPY_ARRAYS` (a client without torch). Treat them
as read-only, and copy what you keep beyond the message when it came through shared memory
(a held view holds pool space, see shm_pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec
import numpy as np

from omni_mp.wire.messages import (
    REQUEST_ID_PATTERN,
    HiddenRows,
    LayerRows,
    Message,
    MRopePositions,
    PackedRows,
    PromptEmbeds,
    StageOutputBatch,
    TensorRef,
)
from omni_mp.wire.shm_pool import ShmReader, ShmRef, ShmRegion
from omni_mp.wire.tensor_codec import (
    DEFAULT_LIMITS,
    NUMPY_ARRAYS,
    ArrayCodec,
    Header,
    Limits,
    PayloadError,
    array_codec,
    check_header,
    shown,
    torch_arrays,
)

__all__ = [
    "DEFAULT_LIMITS",
    "NUMPY_ARRAYS",
    "ArrayCodec",
    "Buffer",
    "BufferPlacer",
    "Limits",
    "PayloadError",
    "decode",
    "decode_with_regions",
    "encode",
    "split_unsendable",
    "torch_arrays",
    "validate",
]

# A buffer for ZMQ send_multipart (bytes, or an object exporting the buffer protocol).
Buffer = Any
# Decides where a tensor's bytes go: gets them as a flat uint8 numpy array and returns the shared
# memory region it copied them into, or None to send them as a frame.
BufferPlacer = Callable[[np.ndarray], ShmRef | None]

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


def _check(msg: msgspec.Struct, limits: Limits, sending: bool, body_bytes: int = 0) -> list[_Slot]:
    """Check every value of `msg` against `limits` and return its tensor slots: arrays when
    sending, TensorRef headers when receiving."""
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
        elif (header := _header(value, path, sending)) is not None:
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
            f"chars of {REQUEST_ID_PATTERN.pattern}"
        )
    _check_total(msg, body_bytes + total, limits)
    return slots


# Tensors whose shape the schema fixes: checked before any tensor exists.
_ROWS_2D = (PromptEmbeds, HiddenRows, LayerRows, PackedRows)


def _check_shape(container: type, header: Header, path: str) -> None:
    dtype, shape, _ = header
    if container in _ROWS_2D and len(shape) != 2:
        raise PayloadError(f"{path}: must be 2-D [rows, hidden], got shape {shape}")
    if container is MRopePositions and (dtype != "int64" or len(shape) != 2 or shape[0] != 3):
        raise PayloadError(f"{path}: M-RoPE positions must be int64 [3, prompt_len], got {dtype} {shape}")


def _header(value: Any, path: str, sending: bool) -> Header | None:
    """The tensor header of a value that is a tensor on this side of the wire, else None."""
    if not sending:
        return (value.dtype, value.shape, value.nbytes) if type(value) is TensorRef else None
    codec = array_codec(value)
    return None if codec is None else codec.header(value, path)


def _valid_request_id(request_id: Any, limits: Limits) -> bool:
    return (
        isinstance(request_id, str)
        and len(request_id) <= limits.max_request_id_length
        and REQUEST_ID_PATTERN.fullmatch(request_id) is not None
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
    _check(msg, limits, True)


def split_unsendable(msg: Message, err: PayloadError, limits: Limits) -> tuple[Message | None, dict[str, str]]:
    """After encoding `msg` raised `err`: what of it may still be sent, and the requests that
    fail instead, with why (request id -> the limit broken). A step's batch keeps the chunks
    within the limits; when none breaks one on its own (the batch as a whole is too large),
    every request in it fails. Any other message fails its one request. A message that
    names no request (a stage bug, not a request's data) raises `err` again."""
    if isinstance(msg, StageOutputBatch):
        failed: dict[str, str] = {}
        chunks = msg.unpacked()  # each chunk with its own rows, to be checked on its own
        for chunk in chunks:
            try:
                _check(chunk, limits, True)
            except PayloadError as chunk_err:
                failed.setdefault(chunk.request_id, str(chunk_err))
        keep = [chunk for chunk in chunks if chunk.request_id not in failed]
        if failed and keep:
            return StageOutputBatch.pack(keep), failed
        return None, failed | {chunk.request_id: str(err) for chunk in keep}
    request_id = getattr(msg, "request_id", None)
    if request_id is None:
        raise err
    return None, {request_id: str(err)}


def encode(msg: Message, limits: Limits = DEFAULT_LIMITS, *, place: BufferPlacer | None = None) -> list[Buffer]:
    """Validate and encode `msg` into frames for send_multipart(copy=False).

    Tensor frames are views of the tensors' memory (a non-contiguous tensor is made
    contiguous first), so do not modify those tensors in place until ZMQ has sent them.
    `place` may divert tensor bytes into shared memory (see transport.MessageSender).
    """
    slots = _check(msg, limits, True)
    frames: list[Buffer] = [b""]
    headers = 0

    def to_header(obj: Any) -> TensorRef:
        nonlocal headers
        codec = array_codec(obj)
        if codec is None:
            raise PayloadError(f"{type(msg).__name__}: {type(obj).__name__} cannot be sent")
        headers += 1
        data = codec.to_bytes(obj)  # the array keeps the tensor (and its memory) alive
        loc = place(data) if place is not None else None
        if loc is None:
            loc = len(frames)
            frames.append(data)
        dtype, shape, nbytes = codec.header(obj, "")
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


def decode(
    frames: Sequence[Buffer],
    limits: Limits = DEFAULT_LIMITS,
    *,
    shm: ShmReader | None = None,
    arrays: ArrayCodec | None = None,
) -> Message:
    """Validate and decode one message (see decode_with_regions)."""
    return decode_with_regions(frames, limits, shm=shm, arrays=arrays)[0]


def decode_with_regions(
    frames: Sequence[Buffer],
    limits: Limits = DEFAULT_LIMITS,
    *,
    shm: ShmReader | None = None,
    arrays: ArrayCodec | None = None,
) -> tuple[Message, list[ShmRegion]]:
    """Validate and decode one message; also return the shared-memory regions it holds.

    Order: sizes of all frames, then the typed body (unknown tags, fields and wrong types
    fail here), then every value against `limits` and every tensor header against its
    buffer (frames must each be used by exactly one tensor), and only then tensors are
    built, as views. Any failure raises PayloadError and returns the credits of the
    shared-memory regions the message named. `shm=None` rejects shared-memory tensors.
    `arrays` builds the tensors (None: torch tensors).
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
        slots = _check(msg, limits, False, body.nbytes)
        buffers = _claim_buffers(slots, views, shm, regions)
        if slots and arrays is None:
            arrays = torch_arrays()
        for slot, buffer in zip(slots, buffers, strict=True):
            slot.put(arrays.from_buffer(slot.dtype, slot.shape, buffer, slot.path))
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

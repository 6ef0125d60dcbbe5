"""Tensor <-> wire primitives: the dtype table, header checks, limits and the one error type.

Import these from `omni_mp.wire.payload`, which re-exports them; this module exists so that
`shm_pool` can use them without depending on the message types.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import msgspec
import torch

# Name on the wire -> torch dtype. Names are torch's own (str(dtype) minus "torch.").
SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in SUPPORTED_DTYPES.items()}

# Upper bounds of the configurable limits below: the message types carry them as
# Meta(max_length=...) so msgspec refuses a longer list while decoding (payload.py).
MAX_NDIM = 32
MAX_LIST_LENGTH = 2**20
MAX_INFO_ENTRIES = 1024

# A peer can send any msgpack it likes, so messages show at most this much of a bad value.
_MAX_SHOWN = 80


class PayloadError(ValueError):
    """A message failed validation. The message text names the field path, the value and the
    limit; `request_id` is set when the offending message's request id could be recovered,
    so a stage can answer with an error event for exactly that request."""

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class Limits(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Bounds every received message is checked against before any tensor is built.

    Loaded from the pipeline YAML (unknown keys rejected). Defaults:
      allowed_dtypes         all of SUPPORTED_DTYPES
      max_ndim               8
      max_tensor_elements    2**30        (a [32k, 32k] tensor)
      max_tensor_bytes       1 GiB        (also the ZMQ MAXMSGSIZE: ZMQ checks frame by frame)
      max_message_bytes      2 GiB        body + every tensor, shared-memory ones included
      max_body_bytes         16 MiB       the msgpack body frame; bounded on its own because
                                          decoding inflates it (~40 B of Python per list item)
      max_info_entries       64           entries of one dict (additional_information, info)
      max_name_length        128          a dict key
      max_string_length      65536        any string (error messages may carry tracebacks)
      max_list_length        2**20        any list (token ids)
      max_request_id_length  128
    """

    allowed_dtypes: tuple[str, ...] = tuple(SUPPORTED_DTYPES)
    max_ndim: int = 8
    max_tensor_elements: int = 2**30
    max_tensor_bytes: int = 2**30
    max_message_bytes: int = 2**31
    max_body_bytes: int = 16 * 2**20
    max_info_entries: int = 64
    max_name_length: int = 128
    max_string_length: int = 65536
    max_list_length: int = 2**20
    max_request_id_length: int = 128

    def __post_init__(self) -> None:
        # Raised as ValueError so msgspec.convert (the YAML loader) reports the key path.
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"Limits.{name} must be > 0, got {value}")
        for name, bound in (
            ("max_ndim", MAX_NDIM),
            ("max_list_length", MAX_LIST_LENGTH),
            ("max_info_entries", MAX_INFO_ENTRIES),
        ):
            if getattr(self, name) > bound:
                raise ValueError(f"Limits.{name} must be <= {bound} (the bound the message types carry)")
        unknown = [d for d in self.allowed_dtypes if d not in SUPPORTED_DTYPES]
        if unknown:
            raise ValueError(f"Limits.allowed_dtypes: unsupported {unknown}; choose from {list(SUPPORTED_DTYPES)}")

    @property
    def max_frame_bytes(self) -> int:
        """The largest single frame a valid message can contain (for ZMQ MAXMSGSIZE)."""
        return max(self.max_tensor_bytes, self.max_body_bytes)


DEFAULT_LIMITS = Limits()


def shown(value: Any) -> str:
    """repr() of a value from the wire, cut short so an error message stays small."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def check_header(dtype: str, shape: list[int], nbytes: int, limits: Limits, path: str) -> None:
    """Validate a tensor header against `limits`. Pure arithmetic: nothing is allocated, so a
    header claiming 10**12 elements costs no more than a valid one."""
    if dtype not in limits.allowed_dtypes:
        raise PayloadError(f"{path}: dtype {shown(dtype)} not in allowed_dtypes {list(limits.allowed_dtypes)}")
    if len(shape) > limits.max_ndim:
        raise PayloadError(f"{path}: ndim {len(shape)} > max_ndim={limits.max_ndim}")
    for dim in shape:
        if dim < 0:
            raise PayloadError(f"{path}: negative dimension {dim} in shape {shown(shape)}")
    numel = math.prod(shape)
    if numel > limits.max_tensor_elements:
        raise PayloadError(
            f"{path}: {numel} elements (shape {shown(shape)}) > max_tensor_elements={limits.max_tensor_elements}"
        )
    expected = numel * SUPPORTED_DTYPES[dtype].itemsize
    if nbytes != expected:
        raise PayloadError(f"{path}: nbytes {nbytes} != {expected} for shape {shown(shape)} of {dtype}")
    if nbytes > limits.max_tensor_bytes:
        raise PayloadError(f"{path}: {nbytes} bytes > max_tensor_bytes={limits.max_tensor_bytes}")


def tensor_header(tensor: torch.Tensor, path: str) -> tuple[str, list[int], int]:
    """(dtype name, shape, nbytes) of a tensor about to be sent; rejects what cannot travel."""
    if tensor.device.type != "cpu":
        # Moving to CPU is a device copy the caller should schedule (and overlap) itself.
        raise PayloadError(f"{path}: tensor is on {tensor.device}; only CPU tensors are sent, call .cpu() first")
    if tensor.layout != torch.strided:
        raise PayloadError(f"{path}: layout {tensor.layout} is not sent; only dense (strided) tensors")
    name = _DTYPE_NAMES.get(tensor.dtype)
    if name is None:
        raise PayloadError(f"{path}: dtype {tensor.dtype} is not supported; supported: {list(SUPPORTED_DTYPES)}")
    return name, list(tensor.shape), tensor.numel() * tensor.element_size()


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor sharing its memory (copies only if the
    tensor is not contiguous). Supported dtypes are real, so no lazy conj/neg bit exists."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def tensor_from_buffer(dtype: str, shape: list[int], buffer: memoryview, path: str) -> torch.Tensor:
    """A tensor viewing `buffer` (no copy). The header must have passed check_header and
    `buffer` must hold exactly its nbytes."""
    torch_dtype = SUPPORTED_DTYPES[dtype]
    if buffer.nbytes == 0:
        return torch.empty(shape, dtype=torch_dtype)  # frombuffer rejects empty buffers
    if buffer.readonly:
        # Only callers passing bytes get here (ZMQ frames and shared memory are writable).
        # torch warns that it cannot mark tensors read-only; the documented contract is that
        # decoded tensors are views to be treated as read-only, so the warning adds nothing.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(buffer, dtype=torch_dtype)
    else:
        flat = torch.frombuffer(buffer, dtype=torch_dtype)
    if torch_dtype is torch.bool and bool((flat.view(torch.uint8) > 1).any()):
        # torch assumes bool bytes are 0 or 1; anything else breaks kernels in odd ways.
        raise PayloadError(f"{path}: bool tensor holds bytes other than 0 and 1")
    return flat.view(shape)
